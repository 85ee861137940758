"""``python -m bench.forecast [--rows N]``: the what-if forecast before and after scipy
(issue 29): the hand-written erfc and Kaplan-Meier against scipy's ``log_ndtr`` and
``ecdf``, and the vectorised Newton fit of the bootstrap against scipy's censored MLE.

"Before" is jobs/analysis/forecast.py as of ``--before`` (default: the last commit with
the hand-written parts), read with ``git show`` and loaded as a module, so the old code
is measured as it was, not as a copy. Both run on one synthetic run (lognormal lengths,
median 2,300, sigma 0.63, cut at 4,096 — ~18% censored — in 5 categories), one after
the other, fastest of ``--repeats`` alternating passes (the machine may be shared: noise
only adds). scipy's fit has no row weights, so its bootstrap refits every resample's
rows, per category and pooled, as the forecast's does; ``--scipy-resamples`` below 200
measures that many and scales to 200 (printed as projected).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
from scipy import stats

from jobs.analysis import forecast as after

REPO = Path(__file__).resolve().parents[1]
BEFORE = "88e8620c03508ea0b06579794ef07a4f9e23c91e"  # last commit with erfcc + own KM
CAP, CAPS = 4096, [5120, 6144, 8192, 16384]


def load_before(rev: str) -> types.ModuleType:
    """jobs/analysis/forecast.py at `rev`, as a module of its own."""
    try:
        source = subprocess.run(["git", "show", f"{rev}:jobs/analysis/forecast.py"],
                                cwd=REPO, check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        why = (getattr(exc, "stderr", None) or str(exc)).strip()
        raise SystemExit(f"cannot read jobs/analysis/forecast.py at {rev} with git show "
                         f"(needs the repository's history): {why}") from exc
    module = types.ModuleType("forecast_before")
    module.__file__ = f"{rev}:jobs/analysis/forecast.py"
    sys.modules[module.__name__] = module  # dataclasses/typing look modules up by name
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def synthetic_run(rows: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    lengths = np.ceil(np.exp(rng.normal(math.log(2300), 0.63, rows))).astype(int)
    cut = lengths > CAP
    return pd.DataFrame({"completion_tokens": np.where(cut, CAP, lengths),
                         "finish_reason": np.where(cut, "length", "stop"),
                         "category": rng.choice(list("abcde"), rows), "max_new_tokens": CAP})


def best(repeats: int, *fns: Callable[[], Any]) -> list[float]:
    """Fastest wall seconds of each fn over alternating passes."""
    times = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            started = time.perf_counter()
            fn()
            times[i] = min(times[i], time.perf_counter() - started)
    return times


def scipy_bootstrap(df: pd.DataFrame, resamples: int, seed: int) -> tuple[float, np.ndarray]:
    """(seconds, (1 + resamples, 6, 2) mu/sigma): the full sample and Poisson-bootstrap
    resamples, each category and the pooled rows fitted by norm.fit(CensoredData)."""
    y = np.log(np.maximum(df["completion_tokens"].to_numpy(dtype=float), 1.0))
    cens = df["finish_reason"].to_numpy() == "length"
    cats = df["category"].to_numpy()
    groups = [cats == c for c in np.unique(cats)] + [np.ones(len(df), bool)]
    rng = np.random.default_rng(seed)
    fits = []
    started = time.perf_counter()
    for b in range(1 + resamples):
        weight = np.ones(len(df), int) if b == 0 else rng.poisson(1.0, len(df))
        fits.append([stats.norm.fit(stats.CensoredData(
            uncensored=np.repeat(y[g & ~cens], weight[g & ~cens]),
            right=np.repeat(y[g & cens], weight[g & cens]))) for g in groups])
    return time.perf_counter() - started, np.array(fits)


def tail_error(log_q: Callable) -> float:
    """Largest relative error of exp(log_q) against math.erfc on z in [-8, 35]."""
    z = np.linspace(-8, 35, 3000)
    ref = np.array([0.5 * math.erfc(v / math.sqrt(2)) for v in z])
    return float(np.abs(np.expm1(log_q(z) - np.log(ref))).max())


def report_gap(a: dict, b: dict, tokens: bool) -> float:
    """Largest |a - b| over the forecast rows' fractions (or token means)."""
    gaps = [abs(x[k] - y[k]) for x, y in zip(a["rows"], b["rows"]) for k in x
            if ("tokens" in k) == tokens and isinstance(x[k], float)
            and isinstance(y[k], float)]
    return max(gaps, default=0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.forecast")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", default=BEFORE, help="git revision of the old code")
    parser.add_argument("--scipy-resamples", type=int, default=after.N_BOOT,
                        help="bootstrap resamples fitted with scipy (scaled to 200)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    before = load_before(args.before)
    df = synthetic_run(args.rows, args.seed)
    sample = after.Sample(df)
    tokens, cens = sample.tokens, sample.censored
    z = np.random.default_rng(1).normal(0, 3, 1_000_000)
    cases = [
        ("forecast_report (whole what-if)", lambda m: m.forecast_report(df, CAPS)),
        ("normal tail log_q, 1M values", lambda m: m.log_q(z)),
        ("Kaplan-Meier at 4 caps + band", lambda m: m.kaplan_meier(tokens, cens, CAPS, CAP)),
        ("censored fit + 200 resamples", lambda m: m._bootstrap_fit(samples[m], 200, 0)),
    ]
    samples = {before: before.Sample(df), after: sample}
    print(f"{args.rows:,} rows, {int(cens.sum()):,} censored, {sample.n_groups} categories; "
          f"before = {args.before[:12]}, after = the working tree; fastest of "
          f"{args.repeats}")
    print(f"{'':34} {'before s':>10} {'after s':>10} {'after/before':>13}")
    for name, run in cases:
        t_before, t_after = best(args.repeats, lambda: run(before), lambda: run(after))
        t_newton = t_after  # the last case: the fit scipy's is set against below
        print(f"{name:34} {t_before:10.4f} {t_after:10.4f} {t_after / t_before:13.2f}")

    seconds, fits = scipy_bootstrap(df, args.scipy_resamples, args.seed)
    newton = after._bootstrap_fit(sample, 0, 0)
    projected = seconds * (1 + after.N_BOOT) / (1 + args.scipy_resamples)
    label = "" if args.scipy_resamples == after.N_BOOT else (
        f" (projected from {args.scipy_resamples} resamples: {seconds:.1f} s)")
    print(f"\ncensored fit + 200 resamples, {sample.n_groups + 1} problems each: Newton "
          f"(after) {t_newton:.4f} s, scipy norm.fit(CensoredData) {projected:.1f} s"
          f"{label}: {projected / t_newton:,.0f}x")
    print(f"full-sample fit, Newton vs scipy: max |mu| diff "
          f"{np.abs(newton[1][0] - fits[0, :-1, 0]).max():.1e}, max |sigma| diff "
          f"{np.abs(newton[2][0] - fits[0, :-1, 1]).max():.1e}")
    print(f"log_q vs math.erfc, max relative error: before {tail_error(before.log_q):.1e}, "
          f"after {tail_error(after.log_q):.1e}")
    old, new = before.forecast_report(df, CAPS), after.forecast_report(df, CAPS)
    print(f"forecast rows, max |after - before|: fractions (model, KM and ranges) "
          f"{report_gap(old, new, False):.1e}, mean tokens {report_gap(old, new, True):.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
