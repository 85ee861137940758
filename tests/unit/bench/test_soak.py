"""bench/soak.py's pure parts: the schedule, the windows and costs of the faults, the idle
time of a sampling interval, the engine process it recognises, the config it runs."""

from __future__ import annotations

import pytest

from bench import soak
from bench.soak import Fault, Sample, idle_increment, schedule, window_cost, windows


def test_the_schedule_keeps_the_order_given_first_then_every_spacing():
    plan = schedule(["engine_kill", "s3_outage", "head_restart"], first_s=30, spacing_s=100)
    assert [(f.name, f.at_s) for f in plan] == [
        ("engine_kill", 30), ("s3_outage", 130), ("head_restart", 230)]
    assert all(f.started is None and f.outcome == "" for f in plan)
    assert [f.name for f in schedule(list(soak.FAULTS), 0, 1)] == list(soak.FAULTS)


@pytest.mark.parametrize("names, first, spacing, error", [
    (["engine_kill", "typo"], 0, 10, "unknown fault"),
    (["engine_kill", "engine_kill"], 0, 10, "named twice"),
    ([], 0, 10, "no fault"),
    (["engine_kill"], -1, 10, "must be >= 0"),
    (["engine_kill"], 0, 0, "must be >= 0"),
])
def test_a_schedule_that_cannot_run_is_refused(names, first, spacing, error):
    with pytest.raises(ValueError, match=error):
        schedule(names, first, spacing)


def test_a_bad_faults_option_exits_2_before_anything_starts(capsys):
    assert soak.main(["--faults", "engine_kill,nope"]) == 2
    assert "unknown fault(s) nope" in capsys.readouterr().err


def _steady(rate: float, idle_rate: float, t0: float, t1: float, c0=0, i0=0.0):
    return [Sample(t, int(c0 + rate * (t - t0)), i0 + idle_rate * (t - t0), 2)
            for t in range(int(t0), int(t1) + 1, 2)]


def test_a_window_at_the_rate_before_costs_nothing():
    samples = _steady(10, 0.2, 0, 200)
    cost = window_cost(samples, 100, 160, baseline_s=60)
    assert cost["rate_before"] == pytest.approx(10)
    assert cost["rows"] == pytest.approx(600)
    assert cost["wall_cost_s"] == pytest.approx(0, abs=0.2)
    assert cost["idle_engine_s"] == pytest.approx(12)
    assert cost["idle_cost_engine_s"] == pytest.approx(0, abs=1e-6)


def test_a_stall_costs_its_length_in_wall_time_and_its_idle_engines():
    # 10 rows/s, then 30 s with no row and both engines idle, then 10 rows/s again
    before = _steady(10, 0.0, 0, 100)
    stall = [Sample(t, 1000, 2.0 * (t - 100), 0) for t in range(102, 131, 2)]
    after = _steady(10, 0.0, 132, 200, c0=1020, i0=60.0)
    cost = window_cost(before + stall + after, 100, 200, baseline_s=60)
    assert cost["wall_cost_s"] == pytest.approx(30, abs=0.5)
    assert cost["idle_cost_engine_s"] == pytest.approx(60, abs=0.5)
    assert cost["window_s"] == 100


def test_the_baseline_is_cut_at_the_first_sample_and_no_rows_before_gives_no_cost():
    samples = _steady(5, 0.0, 50, 150)
    cost = window_cost(samples, 60, 100, baseline_s=60)  # 10 s of baseline only
    assert cost["rate_before"] == pytest.approx(5, abs=0.3)
    idle = [Sample(t, 0, 0.0, 2) for t in range(0, 101, 2)]
    assert window_cost(idle, 50, 100, 30)["wall_cost_s"] is None
    assert window_cost(idle, 0, 100, 30)["rate_before"] is None  # no baseline at all
    with pytest.raises(ValueError, match="empty window"):
        window_cost(idle, 50, 50, 30)


def test_windows_run_to_the_next_injected_fault_and_the_last_is_capped():
    a, b, c = Fault("engine_kill", 0), Fault("s3_outage", 100), Fault("driver_kill", 200)
    a.started, c.started = 1000.0, 1150.0  # b was never injected
    assert [(f.name, s, e) for f, s, e in windows([a, b, c], spacing_s=120, settle_s=60,
                                                  run_end=1200)] == [
        ("engine_kill", 1000.0, 1150.0), ("driver_kill", 1150.0, 1200.0)]
    # the last: spacing long, or until settle_s after it was over (a slow resume's cost)
    assert windows([a], spacing_s=120, settle_s=60, run_end=5000)[0][2] == 1120.0
    a.ended = 1200.0
    assert windows([a], spacing_s=120, settle_s=60, run_end=5000)[0][2] == 1260.0
    assert windows([a], spacing_s=120, settle_s=60, run_end=1230)[0][2] == 1230.0


def test_idle_counts_each_engines_counter_and_every_empty_slot_whole():
    # both engines answered at both ends: their own idle (clamped to the interval)
    assert idle_increment({1: 10.0, 2: 5.0}, {1: 10.5, 2: 9.0}, dt=2.0, slots=2) == 2.5
    # engine 2 replaced by 3 (a new pid): that slot idles the whole interval
    assert idle_increment({1: 10.0, 2: 5.0}, {1: 10.0, 3: 0.0}, dt=2.0, slots=2) == 2.0
    # a stopped engine does not answer; the cluster down: every slot idle
    assert idle_increment({1: 1.0, 2: 1.0}, {1: 1.0}, dt=2.0, slots=2) == 2.0
    assert idle_increment({}, {}, dt=3.0, slots=2) == 6.0
    # a counter reset never counts negative
    assert idle_increment({1: 50.0}, {1: 0.0}, dt=2.0, slots=1) == 0.0


def test_only_the_engine_itself_is_an_engine_not_its_guard():
    engine = ["/venv/bin/python", "-m", "serve_apps.engines.simulator", "--host", "127.0.0.1",
              "--port", "41234", "--model-name", "sim"]
    guard = ["/venv/bin/python", "-m", "serve_apps.engine_guard", "--parent-pid", "9", "--",
             *engine]
    assert soak.engine_port(engine) == 41234
    assert soak.engine_port(guard) is None
    assert soak.engine_port(engine[:5]) is None  # no --port
    assert soak.engine_port([]) is None


def test_the_soak_runs_the_demo_config_with_its_own_input_output_app_and_endpoint():
    args = soak.parse_args(["--time-scale", "0.2", "--set", "job.lease_timeout_s=300",
                            "--set", "serve.autoscaling.max_replicas=3"])
    tree = soak.soak_config(args, "s3://b/p.jsonl", "soak-x", "http://127.0.0.1:1")
    assert tree["job"]["input"] == "s3://b/p.jsonl" and tree["job"]["run_name"] == "soak-x"
    assert tree["job"]["output"] == f"s3://{soak.BUCKET}/runs"
    assert tree["serve"]["app_name"] == soak.APP
    assert tree["engine"]["simulator"]["time_scale"] == 0.2
    assert tree["storage"]["endpoint_url"] == "http://127.0.0.1:1"
    assert tree["job"]["lease_timeout_s"] == 300
    assert tree["serve"]["autoscaling"]["max_replicas"] == 3
    assert tree["job"]["max_new_tokens"] == 4096  # the demo's own settings stay
    assert args.prompts == 20000 and args.fault_names == list(soak.FAULTS)


def test_the_checks_fail_on_each_thing_a_sound_soak_has_none_of():
    report = {"keys": 3, "rows": 4, "latest_rows": 3, "versions_above_0": 1, "lost": [],
              "open_failures": [],
              "not_generated": [], "unexpected": [], "duplicated": [], "flagged_latest": [],
              "unreadable": [], "quarantined": 0}
    fault = Fault("engine_kill", 0, started=1.0)
    attempt = {"attempt": 0, "exit_code": 0, "ended_by": "succeeded"}
    ok = soak.checks_of(report, [], [], [fault], [attempt], True)
    assert all(passed for _, passed, _ in ok), ok

    def failed(**changes):
        r = {**report, **{k: v for k, v in changes.items() if k in report}}
        checks = soak.checks_of(r, changes.get("running", []), changes.get("after", []),
                                changes.get("faults", [fault]),
                                changes.get("attempts", [attempt]), changes.get("ok", True))
        return [name for name, passed, _ in checks if not passed]

    assert failed(lost=["k1"], latest_rows=2) == ["every key exactly once at its latest version"]
    assert failed(duplicated=["k1#0"]) == ["every key exactly once at its latest version"]
    assert failed(flagged_latest=["k2"]) == ["no flagged latest row"]
    assert failed(unreadable=["data/x.parquet: boom"]) == ["no unreadable part"]
    assert failed(running=[123]) == ["no engine process left"]
    assert failed(after=[123]) == ["no engine process left"]
    assert failed(faults=[fault, Fault("s3_outage", 9)]) == ["every fault injected"]
    assert failed(attempts=[{"attempt": 0, "exit_code": 1, "ended_by": "unplanned"}, attempt]
                  ) == ["no session ended but by the driver kill and the head restart"]
    assert failed(ok=False) == ["the command exited 0"]
