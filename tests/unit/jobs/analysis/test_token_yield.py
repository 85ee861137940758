"""jobs.analysis.token_yield: what a trainer at its max length keeps, what it cuts, what
the cut tokens cost; and the what-if in trainable tokens."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math

import numpy as np
import pandas as pd
import pytest

from jobs.analysis import report, token_yield
from jobs.analysis.forecast import forecast_report
from tests.support.run_rows import T0, make_row, write_rows


def test_trainable_is_what_fits_after_the_prompt():
    prompt = np.array([100, 3000, 5000, 4096, 0])
    output = np.array([1000, 2000, 10, 7, 4096])
    assert token_yield.trainable(prompt, output, 4096).tolist() == [1000, 1096, 0, 0, 4096]


def test_busy_time_is_the_union_of_each_replicas_intervals():
    replica = np.array(["a", "a", "a", "b", "b"])
    end = np.array([10.0, 15.0, 30.0, 10.0, 9.0])
    latency = np.array([10.0, 10.0, 10.0, 10.0, 2.0])
    # a: [0,10] u [5,15] u [20,30] = 25 s; b: [0,10] u [7,9] = 10 s
    assert token_yield.busy_seconds(replica, end, latency) == pytest.approx(35.0)
    assert token_yield.busy_seconds(replica[:0], end[:0], latency[:0]) == 0.0


def test_clock_measures_in_flight_on_first_versions_only():
    at = [T0 + dt.timedelta(seconds=s) for s in (10, 10, 10, 500)]
    clock = token_yield.measure_clock(["r0", "r0", "r1", "r0"], pd.Series(at),
                                      [10.0, 5.0, 10.0, 400.0], [0, 0, 0, 1])
    # r0 busy [0,10] (two rows), r1 [0,10]: 20 replica-s for 25 latency-s; the continued
    # row (latency summed over sessions, 400 s) is not measured.
    assert (clock.busy_s, clock.latency_s, clock.rows, clock.replicas) == (20.0, 25.0, 3, 2)
    assert clock.in_flight == pytest.approx(1.25)
    assert clock.gpu_seconds(10.0) == pytest.approx(8.0)
    assert token_yield.measure_clock(["r0"], pd.Series([T0]), [None], [0]) is None


def test_group_yield_counts_tokens_and_their_gpu_time():
    clock = token_yield.GpuClock(busy_s=3600.0, latency_s=7200.0, rows=2, replicas=1)  # 2 in flight
    g = token_yield.group_yield(np.array([1000, 3000, 5000]), np.array([2000, 2000, 100]),
                                np.array([3600.0, 1800.0, 360.0]), 4096, clock)
    # trainable 2000, 1096, 0 of 2000, 2000, 100; row costs 0.5 h, 0.25 h, 0.05 h
    assert (g["rows"], g["rows_cut"], g["rows_without_trainable"]) == (3, 2, 1)
    assert (g["output_tokens"], g["trainable_tokens"], g["cut_tokens"]) == (4100, 3096, 1004)
    assert g["trainable_pct"] == pytest.approx(100 * 3096 / 4100, abs=0.01)
    assert g["gpu_hours"] == pytest.approx(0.8)
    cut_h = 0.25 * 904 / 2000 + 0.05
    assert g["cut_gpu_hours"] == pytest.approx(cut_h, rel=1e-3)
    assert g["cut_gpu_pct"] == pytest.approx(100 * cut_h / 0.8, abs=0.01)
    # Without a clock: tokens only.
    bare = token_yield.group_yield(np.array([1000]), np.array([10]), None, 4096, None)
    assert bare["trainable_tokens"] == 10 and bare["gpu_hours"] is None


def test_parse_lengths():
    assert token_yield.parse_lengths("4096, 2048,4096") == [2048, 4096]
    assert token_yield.parse_lengths(None) is None
    for bad in ("x", "0", "-5"):
        with pytest.raises(argparse.ArgumentTypeError):
            token_yield.parse_lengths(bad)
    assert token_yield.parse_length("4096") == 4096
    with pytest.raises(argparse.ArgumentTypeError, match="one token count"):
        token_yield.parse_length("2048,4096")


def _timed_rows() -> list[dict]:
    """Two replicas, each busy 100 s with two overlapping rows; a continued key."""
    at = lambda s: T0 + dt.timedelta(seconds=s)  # noqa: E731
    return [
        make_row("a", category="code", prompt_tokens=1000, completion_tokens=3000,
                 latency_s=100.0, replica="r0", created_at=at(100)),
        make_row("b", category="code", prompt_tokens=100, completion_tokens=500,
                 latency_s=50.0, replica="r0", created_at=at(60)),
        make_row("c", category="chat", prompt_tokens=3000, completion_tokens=2000,
                 latency_s=100.0, replica="r1", created_at=at(100)),
        make_row("d", category="chat", prompt_tokens=200, completion_tokens=4096,
                 finish_reason="length", latency_s=100.0, replica="r1", created_at=at(100)),
        make_row("d", 1, category="chat", prompt_tokens=200, completion_tokens=6000,
                 latency_s=180.0, replica="r0", created_at=at(900), max_new_tokens=8192,
                 budget_history=[4096, 8192]),
    ]


def test_report_yield_by_category(store, capsys):
    write_rows(store, "data", _timed_rows())
    rep = report.build_report(store, caps=[4096, 8192], trainer_max_lengths=[4096])
    ty = rep["token_yield"]
    # in flight, on the first-version latest rows a, b, c: 250 latency-s over 200 busy
    # replica-s (r0 [0,100] u [10,60], r1 [0,100]); d's latest is a continuation
    assert ty["gpu_clock"]["mean_requests_in_flight"] == 1.25
    sec = ty["by_max_length"]["4096"]
    code, chat = sec["by_category"]["code"], sec["by_category"]["chat"]
    assert (code["output_tokens"], code["trainable_tokens"], code["rows_cut"]) == (3500, 3500, 0)
    # c: room 1096 of 2000; d (latest: 6000 tokens, continued): room 3896 of 6000
    assert (chat["output_tokens"], chat["trainable_tokens"]) == (8000, 1096 + 3896)
    assert chat["rows_cut"] == 2
    hours = lambda s: s / 1.25 / 3600  # noqa: E731
    assert chat["gpu_hours"] == pytest.approx(hours(100 + 180), rel=1e-3)
    assert chat["cut_gpu_hours"] == pytest.approx(
        hours(100 * 904 / 2000 + 180 * 2104 / 6000), rel=1e-3)
    assert code["cut_gpu_hours"] == 0
    assert sec["overall"]["trainable_tokens"] == 3500 + 1096 + 3896
    # No flag: no section.
    assert report.build_report(store)["token_yield"] is None
    # The CLI flag reaches report.json and report.md.
    assert report.main([store.root.path, "--trainer-max-length", "2048,4096"]) == 0
    out = capsys.readouterr().out
    assert "## Trainable tokens at trainer max length 2,048" in out
    assert "## What-if in trainable tokens (trainer max length 4,096)" in out
    on_disk = json.loads(open(f"{store.root.path}/report.json").read())
    assert on_disk["token_yield"]["max_lengths"] == [2048, 4096]
    assert set(on_disk["forecast"]["rows"][0]["trainable"]) == {"2048", "4096"}


def _coupled_run(n: int = 20_000, cap: int = 4096, seed: int = 3):
    """Longer prompts think longer (as in the demo): the what-if must follow the rows."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(50, 3000, n)
    length = np.ceil(np.exp(rng.normal(np.log(1500) + 0.3 * np.log(prompt / 500), 0.6))
                     ).astype(int)
    df = pd.DataFrame({
        "key": [f"k{i}" for i in range(n)], "completion_tokens": np.minimum(length, cap),
        "finish_reason": np.where(length > cap, "length", "stop"), "prompt_tokens": prompt,
        "max_new_tokens": cap, "category": np.where(np.arange(n) % 3, "a", "b")})
    return df, prompt, length


def test_what_if_in_trainable_tokens_tracks_the_truth():
    df, prompt, length = _coupled_run()
    fc = forecast_report(df, [2048, 4096, 8192, 16384], trainer_max_lengths=[4096, 8192])
    for row in fc["rows"]:
        cap = row["cap"]
        for n in (4096, 8192):
            t = row["trainable"][str(n)]
            room = np.maximum(n - prompt, 0)
            every = np.minimum(np.minimum(length, cap), room).mean()
            done = np.where(length <= cap, np.minimum(length, room), 0).mean()
            if cap <= 4096:  # every length is known at or below the cap: exact
                assert t["mean_trainable_tokens"] == pytest.approx(every, abs=0.05)
                assert t["mean_trainable_tokens_finished"] == pytest.approx(done, abs=0.05)
            else:  # censored tails from the fit: the truth within 1%
                assert t["mean_trainable_tokens"] == pytest.approx(every, rel=0.01)
                assert t["mean_trainable_tokens_finished"] == pytest.approx(done, rel=0.01)
                assert t["mean_trainable_tokens_lo"] <= t["mean_trainable_tokens_hi"]
    at = {r["cap"]: r["trainable"]["4096"] for r in fc["rows"]}
    # A trainer at 4096 cannot use more than 4096 - prompt tokens: a cap past that buys
    # finished rows, never more tokens per row than cutting them at the room would.
    assert at[16384]["mean_trainable_tokens"] == at[4096]["mean_trainable_tokens"]
    assert at[4096]["relative_trainable"] == 1.0
    assert at[8192]["relative_trainable_finished"] > 1.0
    assert any("Trainable tokens per row" in note for note in fc["notes"])


def test_what_if_without_trainer_length_or_prompts_has_no_trainable_figures():
    df, _, _ = _coupled_run(n=2000)
    assert "trainable" not in forecast_report(df, [8192])["rows"][0]
    bare = df.drop(columns=["prompt_tokens"])
    assert "trainable" not in forecast_report(bare, [8192], trainer_max_lengths=[4096])["rows"][0]


def test_tail_trainable_closed_forms():
    """Against a Monte Carlo of L ~ lognormal given L > c0."""
    rng = np.random.default_rng(0)
    mu, sigma, c0 = math.log(3000), 0.6, 4096.0
    draws = np.exp(rng.normal(mu, sigma, 4_000_000))
    tail = draws[draws > c0]
    for room, cap in ((100.0, 8192.0), (5000.0, 8192.0), (9000.0, 8192.0), (0.0, 8192.0),
                      (6000.0, 16384.0)):
        every, done = token_yield.tail_trainable(np.float64(mu), np.float64(sigma), c0,
                                                 np.float64(room), cap)
        want_every = np.minimum(np.minimum(tail, cap), room).mean()
        want_done = np.where(tail <= cap, np.minimum(tail, room), 0).mean()
        assert float(every) == pytest.approx(want_every, rel=5e-3, abs=0.5), (room, cap)
        assert float(done) == pytest.approx(want_done, rel=5e-3, abs=0.5), (room, cap)


def test_export_manifest_counts_the_rows_written(store, tmp_path, capsys):
    """The manifest's token_yield is over the rows the export wrote (after its filters),
    the GPU clock over every latest row read (a dropped row kept its replica busy too)."""
    from jobs.analysis import export

    rows = _timed_rows()
    for row in rows:  # the id lists are what the export counts
        row["prompt_token_ids"] = list(range(row["prompt_tokens"]))
        row["output_token_ids"] = list(range(row["completion_tokens"]))
    write_rows(store, "data", rows)
    out = tmp_path / "export"
    manifest = export.export(store, str(out), "pretokenized", trainer_max_length=4096)
    ty = manifest["token_yield"]
    assert manifest["rows"] == 4  # a, b, c, d (d's latest: stop)
    assert ty["max_length"] == 4096 and ty["gpu_clock"]["mean_requests_in_flight"] == 1.25
    assert ty["by_category"]["chat"]["trainable_tokens"] == 1096 + 3896
    assert ty["overall"]["cut_tokens"] == 904 + 2104
    written = [json.loads(line) for line in (out / "part-00000.jsonl").read_text().splitlines()]
    # The same count from the records themselves: loss-mask tokens within the first N.
    assert sum(sum(r["loss_mask"][:4096]) for r in written) == ty["overall"]["trainable_tokens"]
    on_disk = json.loads((out / "export.manifest").read_text())
    assert on_disk["token_yield"] == ty
    # Only the rows written: the category filter drops code, the clock stays the run's.
    only = export.export(store, str(out), "pretokenized",
                         export.Filters(categories=("chat",)), trainer_max_length=2048)
    assert set(only["token_yield"]["by_category"]) == {"chat"}
    assert only["token_yield"]["gpu_clock"] == ty["gpu_clock"]
    assert export.export(store, str(out), "pretokenized")["token_yield"] is None
    # The CLI flag, and its one line in the summary.
    assert export.main([store.root.path, "--format", "pretokenized", "--out", str(out),
                        "--trainer-max-length", "4096"]) == 0
    assert "trainable at max length 4,096: 8,492 of 11,500 output tokens" in (
        capsys.readouterr().out)
