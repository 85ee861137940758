"""The canary's verdict (majority of live replicas; a tie drains nobody) and what a drain
condemns (its window and the rows still in its engine, per run)."""

from __future__ import annotations

from contract.protocol import GenerateResult
from serve_apps import canary
from serve_apps.output_watch import OutputWatch

TTL = 30.0


def _report(tally, replica, digest, now=0.0):
    return tally.report("app:hash", replica, digest, TTL, now=now)


def test_the_minority_of_three_replicas_diverges_and_the_majority_does_not():
    tally = canary.CanaryTally()
    assert _report(tally, "bad", "x") is None        # alone: nothing to compare with
    assert _report(tally, "s1", "y") is None         # 1 against 1: a tie
    assert _report(tally, "s2", "y") is None         # with the majority
    why = _report(tally, "bad", "x")
    assert why and "differ from those 2 of the 3 live replicas agree on" in why
    assert _report(tally, "s1", "y") is None


def test_two_replicas_that_disagree_are_a_tie_and_reports_expire():
    tally = canary.CanaryTally()
    _report(tally, "a", "x")
    assert _report(tally, "b", "y") is None and _report(tally, "a", "x") is None
    _report(tally, "c", "y", now=1.0)
    assert _report(tally, "a", "x", now=2.0)  # a minority of three
    # every earlier report has expired: a alone has nobody to disagree with
    assert _report(tally, "a", "x", now=TTL + 1.5) is None
    tally.withdraw("app:hash", "c")
    assert set(tally.reports["app:hash"]) == {"a"}


def test_scopes_never_mix():
    tally = canary.CanaryTally()
    for r in ("s1", "s2"):
        tally.report("app:one", r, "y", TTL, now=0.0)
    assert tally.report("app:other", "bad", "x", TTL, now=0.0) is None


def test_a_round_with_a_failed_prompt_has_no_digest():
    ok = [GenerateResult(key="k", output_token_ids=[1, 2])] * 2
    assert canary.digest(ok) == canary.digest(list(ok))
    assert canary.digest(ok) != canary.digest([GenerateResult(key="k", output_token_ids=[2, 1])] * 2)
    assert canary.digest(ok[:1] + [GenerateResult.failed("k", "engine_dead", "gone")]) is None
    assert len(canary.requests(8)) == len(canary.PROMPTS)
    assert all(r.sampling == {"temperature": 0.0} and r.max_new_tokens == 8
               for r in canary.requests(8))


def _result(key: str, broken: bool) -> GenerateResult:
    return GenerateResult(key=key, finish_reason="stop", finished_thinking=not broken,
                          reasoning="r", answer="" if broken else "a", output_token_ids=[5, 6])


def test_a_drain_condemns_its_window_and_the_rows_in_flight_per_run():
    watch = OutputWatch(0.5, 4, replica="rep-1")
    for i, broken in enumerate([False, True, True, True]):
        run = "other" if i == 0 else "run"
        watch.observe(run, _result(f"k{i}", broken), inflight=[("run", "late"), ("run", "k3")])
    assert watch.drain is not None and watch.drained.startswith("drained: 3 of its last 4")
    assert watch.drain.keys == {"other": ["k0"], "run": ["k1", "k2", "k3", "late"]}
    record = watch.drain.record_for("run")
    assert record["replica"] == "rep-1" and record["keys"] == ["k1", "k2", "k3", "late"]
    assert watch.drain.record_for("third")["keys"] == []
    watch.observe("run", _result("k9", True))  # drained once: the record stays as it was
    assert "k9" not in watch.drain.keys["run"]


def test_a_canary_drain_condemns_the_window_even_with_the_flag_drain_off():
    watch = OutputWatch(None, 8, replica="rep-2")
    for i in range(3):
        watch.observe("run", _result(f"k{i}", True))
    assert watch.drain is None  # the flag drain is off
    watch.drain_now("drained: canary")
    assert watch.drained == "drained: canary" and watch.drain.keys == {"run": ["k0", "k1", "k2"]}


def test_a_drain_condemns_every_flagged_row_since_the_last_sound_canary():
    """Rows the engine broke before the window tipped (or before the drain was judged)
    are condemned too, not only the window's: none stays a key's latest row."""
    watch = OutputWatch(0.5, 4, replica="rep-3")
    watch.observe("run", _result("natural", True))   # flagged, then the canary agrees
    watch.sound()
    for i, broken in enumerate([True, False, False, False, False, True, True]):
        watch.observe("run", _result(f"k{i}", broken))
    assert watch.drain is None  # 2 of the last 4: not over half yet
    watch.observe("run", _result("k7", True))
    assert watch.drain is not None
    # k0 left the window long ago but was flagged after the sound canary: condemned;
    # k1 (sound, outside the window) and "natural" (before the canary) are not.
    assert watch.drain.keys == {"run": ["k0", "k4", "k5", "k6", "k7"]}
    watch.sound()  # a canary after the drain changes nothing
    assert watch.drain.keys["run"][0] == "k0"


def test_a_canary_drain_condemns_every_row_since_the_last_sound_canary():
    """A drift looks sound to the flags: every row since the canary last agreed goes,
    flagged or not; without the canary nothing is kept beyond the window."""
    watch = OutputWatch(0.5, 2, replica="rep-4", canary=True)
    watch.observe("run", _result("before", False))
    watch.sound()
    for i in range(5):
        watch.observe("run", _result(f"d{i}", False))
    watch.drain_now("drained: canary", inflight=[("run", "held")], since_sound=True)
    assert watch.drain.keys == {"run": ["d0", "d1", "d2", "d3", "d4", "held"]}
    flag_drain = OutputWatch(0.5, 2, replica="rep-5", canary=True)
    for i in range(5):
        flag_drain.observe("run", _result(f"s{i}", False))
    flag_drain.drain_now("drained: flags")  # not a canary drain: the window only
    assert flag_drain.drain.keys == {"run": ["s3", "s4"]}
    assert OutputWatch(0.5, 2).since_sound is None  # canary off: nothing kept


def test_a_sound_canary_vouches_only_for_the_rows_before_its_round_began():
    """A drift that begins after the canary's prompts are answered, before its verdict is
    back, passes that round: the rows returned while it ran are not cleared by it, so the
    next (diverging) round's drain still condemns them (a CI run lost one such row)."""
    watch = OutputWatch(0.5, 2, replica="rep-6", canary=True)
    watch.observe("run", _result("sound", False))
    watch.observe("run", _result("flagged-before", True))
    began = watch.observed                                  # the round starts
    watch.observe("run", _result("during", False))          # drifted while it ran
    watch.observe("other", _result("flagged-during", True))
    watch.sound(before=began)                               # it agreed
    assert watch.since_sound == {"run": {"during": 2}, "other": {"flagged-during": 3}}
    watch.observe("run", _result("after", False))
    watch.drain_now("drained: canary", since_sound=True)
    assert watch.drain.keys == {"run": ["after", "during"], "other": ["flagged-during"]}
    # the flagged rows kept beyond the window: the round's, not those before it
    flags = OutputWatch(0.5, 8, replica="rep-7")
    flags.observe("run", _result("old", True))
    began = flags.observed
    flags.observe("run", _result("new", True))
    flags.sound(before=began)
    assert flags.flagged == {"run": {"new": 1}}
