"""jobs.analysis.forecast: the censored lognormal what-if, its ranges and Kaplan-Meier."""

from __future__ import annotations

import math
import time
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from jobs.analysis import forecast as F
from tests.support.run_rows import censor, lognormal_lengths

MEDIAN, SIGMA, CAP = 2300, 0.63, 4096
MU = math.log(MEDIAN)


def true_tail(cap: float, mu: float = MU, sigma: float = SIGMA) -> float:
    return 0.5 * math.erfc((math.log(cap) - mu) / sigma / math.sqrt(2))


def frame(lengths, cap=CAP, category="none") -> pd.DataFrame:
    tokens, finish = censor(lengths, cap)
    return pd.DataFrame({"completion_tokens": tokens, "finish_reason": finish,
                         "category": category, "max_new_tokens": cap})


def exact_loglik(mu, sigma, y, c):
    """Censored-normal log-likelihood with math.erfc (the reference)."""
    z = (y - mu) / sigma
    ll = float((-0.5 * z * z - math.log(sigma) - 0.5 * math.log(2 * math.pi)).sum())
    return ll + sum(math.log(0.5 * math.erfc((ci - mu) / sigma / math.sqrt(2))) for ci in c)


def test_log_tail_matches_math_erfc():
    z = np.linspace(-8, 35, 3000)
    ref = np.array([0.5 * math.erfc(v / math.sqrt(2)) for v in z])
    ok = ref > 0
    rel = np.abs(np.expm1(F.log_q(z[ok]) - np.log(ref[ok])))
    assert rel.max() < 2e-7
    assert np.isfinite(F.log_q(np.array([60.0, 200.0]))).all()  # no underflow to -inf


def test_mle_maximises_the_exact_likelihood():
    lengths = lognormal_lengths(3000, MEDIAN, SIGMA, seed=11)
    y = np.log(lengths[lengths <= CAP]).astype(float)
    c = np.full(int((lengths > CAP).sum()), math.log(CAP))
    mu, sigma = F.fit_censored([y.size], [y.sum()], [(y ** 2).sum()], [[c.size]],
                               [math.log(CAP)])
    best = exact_loglik(mu[0], sigma[0], y, c)
    for dm, ds in [(0.01, 0), (-0.01, 0), (0, 0.01), (0, -0.01), (0.005, 0.005)]:
        assert exact_loglik(mu[0] + dm, sigma[0] + ds, y, c) < best


def test_mle_equals_scipys_censored_fit():
    """scipy's censored MLE (one problem, by its optimizer) is the reference; the Newton
    fit (kept for the vectorised bootstrap) reaches it, with two censoring points."""
    lengths = lognormal_lengths(3000, MEDIAN, SIGMA, seed=11)
    budgets = np.where(np.arange(lengths.size) % 3 == 0, 2500, CAP)
    cut = lengths > budgets
    y = np.log(np.minimum(lengths, budgets)).astype(float)
    ref = stats.norm.fit(stats.CensoredData(uncensored=y[~cut], right=y[cut]))
    u, (points, counts) = y[~cut], np.unique(y[cut], return_counts=True)
    mu, sigma = F.fit_censored([u.size], [u.sum()], [(u ** 2).sum()], [counts], points)
    assert (mu[0], sigma[0]) == pytest.approx(ref, abs=1e-4)
    # scipy's optimizer stops within its tolerance; Newton's optimum is at least as good.
    assert (exact_loglik(mu[0], sigma[0], u, y[cut])
            >= exact_loglik(*ref, u, y[cut]) - 1e-9)


def test_kaplan_meier_where_every_row_finished():
    """S reaches 0 after the longest row: the band is [0, 0], not Greenwood's 0/0."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        km = F.kaplan_meier(np.array([1.0, 2.0, 3.0]), np.zeros(3, bool), [2, 5, 6], 5)
    assert km[1] == (0.0, 0.0, 0.0, 2.0) and km[2] is None
    assert km[0][0] == pytest.approx(1 / 3) and km[0][1] == 0.0 < km[0][2] < 1.0


def test_recovers_known_lognormal_from_censored_sample():
    lengths = lognormal_lengths(20000, MEDIAN, SIGMA, seed=2026)
    df = frame(lengths)
    assert 0.16 < (df["finish_reason"] == "length").mean() < 0.20   # ~18% censored
    rep = F.forecast_report(df, [8192, 16384])
    (fit,) = rep["categories"]
    assert fit["mu"] == pytest.approx(MU, abs=0.02)
    assert fit["sigma"] == pytest.approx(SIGMA, rel=0.03)
    for row in rep["rows"]:
        truth = true_tail(row["cap"])
        assert row["extrapolated"] and "extrapolated" in row["method"]
        assert row["truncated_lo"] <= truth <= row["truncated_hi"], (row, truth)
        width = (row["truncated_hi"] - row["truncated_lo"]) / truth
        assert width < (0.2 if row["cap"] == 8192 else 0.5), row   # not absurdly wide
        assert row["truncated_lo"] <= row["truncated_fraction"] <= row["truncated_hi"]


def test_ranges_have_roughly_their_stated_coverage():
    caps = [8192, 16384]
    hits = np.zeros(len(caps))
    trials = 40
    for seed in range(trials):
        rows = F.forecast(frame(lognormal_lengths(2000, MEDIAN, SIGMA, seed=100 + seed)), caps,
                          seed=seed)
        hits += [r["truncated_lo"] <= true_tail(r["cap"]) <= r["truncated_hi"] for r in rows]
    coverage = hits / trials
    assert (coverage >= 0.75).all(), coverage   # nominal 90%


def test_per_category_fits_are_mixed_by_share():
    chat = frame(lognormal_lengths(8000, 1200, 0.5, seed=1), category="chat")
    code = frame(lognormal_lengths(4000, 3500, 0.6, seed=2), category="code")
    rep = F.forecast_report(pd.concat([chat, code], ignore_index=True), [8192, 16384])
    for row in rep["rows"]:
        truth = (2 * true_tail(row["cap"], math.log(1200), 0.5)
                 + true_tail(row["cap"], math.log(3500), 0.6)) / 3
        assert row["truncated_lo"] <= truth <= row["truncated_hi"], (row, truth)
    assert {c["category"]: c["share"] for c in rep["categories"]} == pytest.approx(
        {"chat": 2 / 3, "code": 1 / 3}, abs=1e-3)


def test_thin_category_falls_back_to_pooled_and_says_so():
    big = frame(lognormal_lengths(3000, MEDIAN, SIGMA, seed=3), category="chat")
    tiny = frame([9000] * 8, category="rare")      # every row truncated
    rep = F.forecast_report(pd.concat([big, tiny], ignore_index=True), [8192])
    rare = next(c for c in rep["categories"] if c["category"] == "rare")
    assert rare["pooled_fallback"]
    assert any("pooled fit: rare" in n for n in rep["notes"])


def test_every_row_censored_is_handled():
    rep = F.forecast_report(frame([9000] * 50), [2048, 4096, 8192])
    by_cap = {r["cap"]: r for r in rep["rows"]}
    assert by_cap[8192]["truncated_fraction"] is None and by_cap[8192]["km_truncated_fraction"] is None
    assert by_cap[2048]["km_truncated_fraction"] == 1.0 == by_cap[4096]["km_truncated_fraction"]
    assert any("Every row" in n for n in rep["notes"])


def test_no_row_censored_matches_closed_form():
    lengths = lognormal_lengths(5000, 900, 0.4, seed=5)
    df = frame(lengths, cap=100_000)
    rep = F.forecast_report(df, [1000, 2000])
    y = np.log(lengths)
    assert rep["categories"][0]["mu"] == pytest.approx(y.mean(), abs=1e-3)
    assert rep["categories"][0]["sigma"] == pytest.approx(y.std(), abs=1e-3)
    for row in rep["rows"]:
        assert row["km_truncated_fraction"] == pytest.approx((lengths > row["cap"]).mean(),
                                                             abs=1e-5)


def test_empty_and_tiny_inputs_do_not_crash():
    empty = pd.DataFrame({"completion_tokens": [], "finish_reason": [], "category": []})
    assert F.forecast(empty, [4096]) == []
    rows = F.forecast(frame([100, 200, 5000]), [4096, 8192])
    assert [r["cap"] for r in rows] == [4096, 8192]


def test_kaplan_meier_equals_empirical_below_the_cap():
    lengths = lognormal_lengths(10000, MEDIAN, SIGMA, seed=9)
    df = frame(lengths)
    caps = [1000, 2048, 3000, 4000, 4096]
    for row in F.forecast(df, caps):
        c = row["cap"]
        assert row["km_truncated_fraction"] == pytest.approx((lengths > c).mean(), abs=1e-5)
        assert row["km_mean_tokens"] == pytest.approx(np.minimum(lengths, c).mean(), abs=0.1)
        assert not row["extrapolated"]


def test_kaplan_meier_with_mixed_budgets_tracks_truth():
    """Rows clamped to smaller budgets: KM stays unbiased where the naive share is not."""
    lengths = lognormal_lengths(20000, MEDIAN, SIGMA, seed=12)
    budgets = np.where(np.arange(lengths.size) % 3 == 0, 2500, CAP)
    km = F.kaplan_meier(np.minimum(lengths, budgets).astype(float), lengths > budgets,
                        [3000, 4000], CAP)
    for (s, lo, hi, _), cap in zip(km, [3000, 4000]):
        assert lo - 0.005 <= true_tail(cap) <= hi + 0.005
        assert hi - lo < 0.03


def test_latest_version_per_key_is_used():
    df = frame([1000, 4096 + 1, 3000])
    df["key"], df["version"] = ["a", "b", "c"], 0
    cont = pd.DataFrame({"completion_tokens": [5000], "finish_reason": ["stop"],
                         "category": ["none"], "max_new_tokens": [CAP], "key": ["b"],
                         "version": [1]})
    both = F.forecast(pd.concat([df, cont], ignore_index=True), [2048], n_boot=0)
    latest = F.forecast(pd.concat([df.iloc[[0, 2]], cont], ignore_index=True), [2048], n_boot=0)
    assert both == latest


def test_gpu_time_is_relative_to_the_current_cap():
    rows = F.forecast(frame(lognormal_lengths(5000, MEDIAN, SIGMA, seed=4)),
                      [2048, 4096, 8192, 16384])
    rel = [r["relative_gpu_time"] for r in rows]
    assert rel[1] == 1.0 and rel == sorted(rel)
    assert all(r["mean_tokens"] <= r["cap"] for r in rows)


def test_forecast_of_100k_rows_is_fast():
    lengths = lognormal_lengths(100_000, MEDIAN, SIGMA, seed=8)
    df = frame(lengths)
    df["category"] = np.random.default_rng(0).choice(["a", "b", "c", "d", "e"], lengths.size)
    start = time.process_time()  # CPU time: robust to other processes sharing the machine
    rows = F.forecast(df, [5120, 6144, 8192, 16384])
    assert time.process_time() - start < 5.0
    assert len(rows) == 4


def test_raising_the_cap_says_what_it_costs_in_gpu_hours():
    """At the run's measured rate: per cap, 1,000 rows' GPU-hours; above the current cap,
    continuing this run's truncated rows to it: n x the expected extra tokens per row."""
    df = frame(lognormal_lengths(4000, MEDIAN, SIGMA, seed=5))
    rate = 1e6  # output tokens per GPU-hour held
    rep = F.forecast_report(df, [2048, 4096, 8192, 16384], n_boot=50,
                            tokens_per_gpu_h=rate, price=2.0)
    below, now, up, far = rep["rows"]
    assert now["gpu_hours_per_1k_rows"] == pytest.approx(1000 * now["mean_tokens"] / rate, rel=1e-3)
    assert now["extra_tokens_per_row"] == 0 and now["continue_gpu_hours"] is None
    assert below["continue_gpu_hours"] is None  # a lower cap is not a continuation
    extra = up["mean_tokens"] - now["mean_tokens"]
    assert up["extra_tokens_per_row"] == pytest.approx(extra, abs=0.2)
    assert up["continue_gpu_hours"] == pytest.approx(4000 * extra / rate, rel=1e-3)
    assert up["continue_gpu_hours_lo"] <= up["continue_gpu_hours"] <= up["continue_gpu_hours_hi"]
    assert far["continue_gpu_hours"] > up["continue_gpu_hours"] > 0
    assert up["continue_cost"] == pytest.approx(2.0 * up["continue_gpu_hours"], abs=0.01)
    # Against the truth: the rows cut at 4,096 need E[min(L, 8192)] - E[min(L, 4096)] more.
    from jobs.analysis.lognormal import parts_below
    truth = 0.0
    for c in (8192, 4096):
        below_c, f_c = parts_below(np.array(MU), np.array(SIGMA), np.array(float(c)))
        truth += (1 if c == 8192 else -1) * float(below_c + c * (1 - f_c))
    assert up["extra_tokens_per_row"] == pytest.approx(truth, rel=0.15)
    # Without a measured rate the fields are there, null.
    bare = F.forecast_report(df, [8192], n_boot=0)["rows"][0]
    assert bare["continue_gpu_hours"] is None and bare["gpu_hours_per_1k_rows"] is None
