"""What-if for the output budget: truncated fraction and cost at other caps.

Design decisions:
- A row cut at its budget (finish_reason "length") is right-censored: its true length
  is *greater* than completion_tokens, not equal to it; counting it as the cap (the
  story's first table) biases every figure down. Abort rows are left out of the fit.
- Model: log(length) ~ Normal(mu, sigma) per category, censored maximum likelihood
  (Tobit) in Olsen's parametrisation (gamma = 1/sigma, beta = mu/sigma), where the
  log-likelihood is globally concave, so damped Newton converges from any start.
  Categories with < MIN_UNCENSORED finished rows use the pooled fit (noted); the run's
  forecast mixes the category fits by row share.
- Fits use sufficient statistics of cells of interchangeable rows (see Sample), so
  200 Poisson-bootstrap resamples x all categories are one vectorised Newton run.
  Ranges are the 5th-95th bootstrap percentiles; their coverage was checked by
  simulation (tests/unit/jobs/analysis/test_forecast.py). scipy's censored MLE
  (norm.fit(CensoredData)) finds the same fit (a test checks) but one problem at a
  time, on rows: the 201 x 6 fits of a 100K-row bootstrap take 28 s there against
  0.005 s here (python -m bench.forecast), hence the Newton fit stays.
- Normal tail: scipy.special.log_ndtr, exact in log space, so tails never underflow.
- Kaplan-Meier (scipy.stats.ecdf on CensoredData, Greenwood band) is given for caps up
  to the observed cap, where the survival function is identifiable; above it every
  figure extrapolates the lognormal shape and the output says so. The KM/model gap
  below the cap is reported as a fit check.
- GPU time ~ expected output tokens per row (decode-bound; prefill is equal at every
  cap). Longer sequences cost a bit more per token (attention over a longer KV cache),
  so raising the cap costs slightly more than shown.
- GPU-hours (with the run's measured rate, output tokens per GPU-hour held:
  jobs/analysis/gpu_hours.py): per cap, what 1,000 rows cost at it, and what raising the
  cap to it costs this run with `--continue-truncated --max-total-tokens C`: the rows'
  expected extra tokens, n x (E[min(L, C)] - E[min(L, current)]), at that rate (the
  continued rows' prefill of prompt + earlier output comes on top).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd

from jobs.analysis import gpu_hours
from jobs.analysis.lognormal import log_q
from jobs.analysis.numbers import rounded
from jobs.analysis.token_yield import trainable_forecast
from jobs.io.run_index import latest_rows

MIN_UNCENSORED = 20          # per-category fit needs this many observed lengths
N_BOOT = 200
CI = (5.0, 95.0)
MAX_CENSOR_GROUPS = 128      # distinct censoring points kept exactly; beyond, 0.5% grid
BIN_WIDTH = 0.02             # log-length bin of a cell (2% of a length), see Sample
BOOT_CHUNK_CELLS = 2_000_000 # resample counts drawn per chunk: bounds memory
FIT_GAP_WARN = 0.02          # |KM - model| above this: the lognormal shape is doubtful
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


# --- normal tail, vectorised ---------------------------------------------------------

# --- censored-normal MLE on sufficient statistics, many problems at once -------------

def _loglik(g, b, nu, s1, s2, m, c):
    """Olsen-parametrised log-likelihood; arrays (M,), m (M,K), c (K,)."""
    z = g[:, None] * c[None, :] - b[:, None]
    return (nu * np.log(g) - 0.5 * (g * g * s2 - 2 * g * b * s1 + b * b * nu)
            + (m * log_q(z)).sum(axis=1))


def _newton_step(g, b, nu, s1, s2, m, c):
    z = g[:, None] * c[None, :] - b[:, None]
    lam = np.exp(-0.5 * z * z - _LOG_SQRT_2PI - log_q(z))  # phi/Q (inverse Mills ratio)
    delta = np.clip(lam * (lam - z), 1e-12, 1.0)  # d lam / dz, in (0, 1)
    grad_g = nu / g - (g * s2 - b * s1) - (m * lam * c).sum(axis=1)
    grad_b = g * s1 - b * nu + (m * lam).sum(axis=1)
    h_gg = -nu / (g * g) - s2 - (m * delta * c * c).sum(axis=1)
    h_gb = s1 + (m * delta * c).sum(axis=1)
    h_bb = -nu - (m * delta).sum(axis=1)
    det = h_gg * h_bb - h_gb * h_gb          # > 0: the Hessian is negative definite
    step_g = -(h_bb * grad_g - h_gb * grad_b) / det
    step_b = -(h_gg * grad_b - h_gb * grad_g) / det
    return step_g, step_b


def fit_censored(nu, s1, s2, m, c, max_iter: int = 100):
    """MLE (mu, sigma) of censored normals, one per row of the inputs.

    nu, s1, s2: count, sum and sum of squares of the uncensored values (M,);
    m: (M, K) counts censored at c (K,) (value known to exceed c). Needs nu >= 2.
    """
    nu, s1, s2 = (np.asarray(v, dtype=float) for v in (nu, s1, s2))
    m, c = np.asarray(m, dtype=float), np.asarray(c, dtype=float)
    mean = s1 / nu
    var = np.maximum(s2 / nu - mean * mean, 1e-6)
    g = 1.0 / np.sqrt(var)
    b = mean * g
    ll = _loglik(g, b, nu, s1, s2, m, c)
    for _ in range(max_iter):
        with np.errstate(divide="ignore", invalid="ignore"):
            dg, db = _newton_step(g, b, nu, s1, s2, m, c)
        # A degenerate problem (e.g. identical lengths) gives a singular Hessian: stay put.
        dg, db = (np.nan_to_num(x, posinf=0.0, neginf=0.0) for x in (dg, db))
        t = np.ones_like(g)
        for _ in range(40):  # step halving, per problem, until the likelihood rises
            g_new, b_new = g + t * dg, b + t * db
            with np.errstate(invalid="ignore", divide="ignore"):
                ll_new = _loglik(np.where(g_new > 0, g_new, 1.0), b_new, nu, s1, s2, m, c)
            bad = (g_new <= 0) | ~(ll_new >= ll - 1e-10 * np.abs(ll))
            if not bad.any():
                break
            t = np.where(bad, t / 2, t)
        g, b, ll = np.where(bad, g, g_new), np.where(bad, b, b_new), np.where(bad, ll, ll_new)
        if np.all(np.abs(t * dg) <= 1e-10 * g) and np.all(np.abs(t * db) <= 1e-9):
            break
    g = np.minimum(g, 1e3)  # sigma >= 1e-3: identical lengths would send it to 0
    return b / g, 1.0 / g


# --- the sample -----------------------------------------------------------------------

class Sample:
    """Rows reduced to cells of interchangeable rows, which is all the fit needs.

    Uncensored rows share a cell when category and log-length bin (BIN_WIDTH) agree;
    the cell keeps the exact mean of y and y^2 of its rows, so the full-sample fit is
    exact and a resample only ignores the spread inside a 2% bin (negligible against
    sigma ~ 0.6). Censored rows share a cell when category and censoring point agree.
    A 100K-row run becomes a few thousand cells, whatever the row count.
    """

    def __init__(self, df: pd.DataFrame):
        # pandas' own comparisons and hash factorizing: no Python string per row (9M
        # rows: seconds saved against astype(str) + np.unique on object arrays)
        finish = df["finish_reason"]
        keep = finish.isin(("stop", "length")).to_numpy(dtype=bool)
        self.n_abort = int((~keep).sum())
        tokens = np.maximum(df["completion_tokens"].to_numpy(dtype=float)[keep], 1.0)
        cats = (df["category"][keep].fillna("none") if "category" in df.columns
                else pd.Series(["none"] * int(keep.sum()), dtype=object))
        codes, uniques = pd.factorize(cats)
        names = np.asarray([str(u) for u in uniques], dtype=object)
        order = np.argsort(names, kind="stable")  # sorted, as np.unique numbered them
        rank = np.empty(order.size, np.int64)
        rank[order] = np.arange(order.size)
        self.categories, cat = names[order].astype(str), rank[codes]
        self.censored = (finish[keep] == "length").to_numpy(dtype=bool)
        self.tokens, self.n = tokens, int(tokens.size)
        logv = np.log(tokens)
        self.y0 = float(np.median(logv)) if logv.size else 0.0  # centring: conditioning
        logv = logv - self.y0
        cens = logv[self.censored]
        if np.unique(cens).size > MAX_CENSOR_GROUPS:
            cens = np.round(cens / 0.005) * 0.005  # ~0.5% of a length: no visible effect
        self.cvals, groups = np.unique(cens, return_inverse=True)
        if not self.cvals.size:  # nothing censored: one empty point keeps shapes (., K>0)
            self.cvals = np.zeros(1)
        self._cells(cat.astype(np.int64), logv, groups)

    def _cells(self, cat: np.ndarray, logv: np.ndarray, groups: np.ndarray) -> None:
        slot = np.floor(logv / BIN_WIDTH).astype(np.int64)
        slot = slot - (slot.min() if slot.size else 0)
        slot[self.censored] = groups
        width = int(slot.max()) + 1 if slot.size else 1
        code = (cat * 2 + self.censored) * width + slot   # cat-major: contiguous per cat
        codes, inv = np.unique(code, return_inverse=True)
        unc = np.where(self.censored, 0.0, 1.0)
        self.count = np.bincount(inv, minlength=codes.size).astype(float)
        with np.errstate(invalid="ignore"):
            self.ymean = np.bincount(inv, unc * logv, codes.size) / self.count
            self.y2mean = np.bincount(inv, unc * logv ** 2, codes.size) / self.count
        self.cell_cat = codes // (2 * width)
        self.cell_cens = (codes // width) % 2 == 1
        u_cat = self.cell_cat[~self.cell_cens]
        self.u_cats, self.u_starts = np.unique(u_cat, return_index=True)
        self.m_code = (self.cell_cat * self.cvals.size + codes % width)[self.cell_cens]

    @property
    def n_groups(self) -> int:
        return len(self.categories)

    def stats(self, k: np.ndarray) -> tuple:
        """Per-category (rows, nu, s1, s2) (B, G) and m (B, G, K) for cell counts k (B, cells)."""
        G, K, B = self.n_groups, self.cvals.size, k.shape[0]
        ku = k[:, ~self.cell_cens]
        nu, s1, s2 = (np.zeros((B, G)) for _ in range(3))
        if self.u_cats.size:
            for out, x in ((nu, ku), (s1, ku * self.ymean[~self.cell_cens]),
                           (s2, ku * self.y2mean[~self.cell_cens])):
                out[:, self.u_cats] = np.add.reduceat(x, self.u_starts, axis=1)
        m = np.zeros((B, G * K))
        m[:, self.m_code] = k[:, self.cell_cens]   # one cell per (category, point)
        m = m.reshape(B, G, K)
        return nu + m.sum(2), nu, s1, s2, m


def _predict(w, mu, sigma, caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mixture P(L > C) and E[min(L, C)], shapes (B, len(caps))."""
    lc = np.log(caps)[None, None, :]
    mu, sigma, w = mu[..., None], sigma[..., None], w[..., None]
    z = (lc - mu) / sigma
    tail = np.exp(log_q(z))
    # E[L; L <= C] = exp(mu + sigma^2/2) * Phi(z - sigma), in log space (no overflow).
    below = np.exp(mu + 0.5 * sigma ** 2 + log_q(sigma - z))
    mean = below + caps[None, None, :] * tail
    return (w * tail).sum(1), (w * mean).sum(1)


# --- Kaplan-Meier ---------------------------------------------------------------------

def kaplan_meier(tokens: np.ndarray, censored: np.ndarray, caps: Sequence[float],
                 limit: float) -> list:
    """[(S(C), lo, hi, E[min(L, C)]) or None] per cap C; None above `limit`.

    S(C) = P(L > C). A censored row stays at risk up to its censoring point (ties:
    events first). Greenwood's 90% band. Above the largest budget any row ran under
    (`limit`) S is not identifiable from the data, hence None.
    """
    if not tokens.size:
        return [None] * len(caps)
    from scipy import stats  # ~0.4 s to import: only when a forecast is asked for
    sf = stats.ecdf(stats.CensoredData(uncensored=tokens[~censored],
                                       right=tokens[censored])).sf
    with warnings.catch_warnings():  # where S reaches 0 the band is 0/0: taken as [0, 0]
        warnings.simplefilter("ignore", RuntimeWarning)
        band = sf.confidence_interval(0.90)
    out: list = []
    for cap in caps:
        if cap > limit:
            out.append(None)
            continue
        s, lo, hi = (float(f.evaluate(cap)) for f in (sf, band.low, band.high))
        # E[min(L, C)] = integral of the step function S(t) over [0, C].
        j = int(np.searchsorted(sf.quantiles, cap, side="right"))
        knots = np.concatenate([[0.0], sf.quantiles[:j], [cap]])
        levels = np.concatenate([[1.0], sf.probabilities[:j]])
        mean = float((np.diff(knots) * levels).sum())
        out.append((s, lo, hi, mean) if s > 0 else (s, 0.0, 0.0, mean))
    return out


# --- the forecast ---------------------------------------------------------------------

def current_cap(df: pd.DataFrame) -> Optional[int]:
    """The budget the run's rows ran under: the largest held by >= 1% of rows.

    After a continuation every row that needed more got the larger budget, so the
    largest budget is the effective one; the 1% floor ignores a few odd rows.
    """
    if "max_new_tokens" in df.columns and df["max_new_tokens"].notna().any():
        share = df["max_new_tokens"].dropna().astype(int).value_counts(normalize=True)
        common = share[share >= 0.01]
        return int((common if len(common) else share).index.max())
    cut = df.loc[df["finish_reason"] == "length", "completion_tokens"]
    return int(cut.max()) if len(cut) else (int(df["completion_tokens"].max()) if len(df)
                                             else None)


def _bootstrap_fit(sample: Sample, n_boot: int, seed: int):
    """Fit on the full sample (row 0) and n_boot Poisson-bootstrap resamples (rows 1..).

    Poisson bootstrap: each row gets a Poisson(1) weight, so a cell of c rows gets a
    Poisson(c) count -- the standard large-sample stand-in for resampling n rows with
    replacement, and it can be drawn per cell instead of per row.
    """
    rng = np.random.default_rng(seed)
    parts = [sample.stats(sample.count[None, :])]
    chunk = max(1, BOOT_CHUNK_CELLS // max(sample.count.size, 1))
    for start in range(0, n_boot, chunk):
        size = min(chunk, n_boot - start)
        parts.append(sample.stats(rng.poisson(sample.count, (size, sample.count.size))
                                  .astype(float)))
    return _fit_resamples(sample, [np.concatenate(x) for x in zip(*parts)])


def _fit_resamples(sample: Sample, stats: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, mu, sigma), each (B, G): per-category fits, pooled where too thin."""
    G, K = sample.n_groups, sample.cvals.size
    rows, nu, s1, s2, m = stats                                            # (B, G[, K])

    def with_pooled(a):  # the pooled problem rides along as category G
        return np.concatenate([a, a.sum(1, keepdims=True)], 1)

    nu_a, s1_a, s2_a = (with_pooled(a).reshape(-1) for a in (nu, s1, s2))
    m_a = with_pooled(m).reshape(-1, K)
    ok = nu_a >= 2
    mu, sigma = np.full(nu_a.size, np.nan), np.full(nu_a.size, np.nan)
    if ok.any():
        mu[ok], sigma[ok] = fit_censored(nu_a[ok], s1_a[ok], s2_a[ok], m_a[ok], sample.cvals)
    mu, sigma = mu.reshape(-1, G + 1), sigma.reshape(-1, G + 1)
    thin = (nu[0] < MIN_UNCENSORED)[None, :] | (nu < 2)   # decided on the full sample
    mu_g = np.where(thin, mu[:, G:], mu[:, :G]) + sample.y0
    sig_g = np.where(thin, sigma[:, G:], sigma[:, :G])
    with np.errstate(invalid="ignore"):  # an empty resample: NaN, dropped later
        return rows / rows.sum(1, keepdims=True), mu_g, sig_g


def _row(cap, point, lo, hi, km, extrapolated, method) -> dict[str, Any]:
    r = rounded
    return {
        "cap": int(cap), "method": method, "extrapolated": extrapolated,
        "truncated_fraction": r(point[0], 5), "truncated_lo": r(lo[0], 5),
        "truncated_hi": r(hi[0], 5), "mean_tokens": r(point[1], 1),
        "mean_tokens_lo": r(lo[1], 1), "mean_tokens_hi": r(hi[1], 1),
        "relative_gpu_time": r(point[2], 4), "relative_gpu_time_lo": r(lo[2], 4),
        "relative_gpu_time_hi": r(hi[2], 4),
        "extra_tokens_per_row": r(point[3], 1) if len(point) > 3 else None,
        "extra_tokens_per_row_lo": r(lo[3], 1) if len(lo) > 3 else None,
        "extra_tokens_per_row_hi": r(hi[3], 1) if len(hi) > 3 else None,
        "km_truncated_fraction": r(km[0], 5) if km else None,
        "km_lo": r(km[1], 5) if km else None, "km_hi": r(km[2], 5) if km else None,
        "km_mean_tokens": r(km[3], 1) if km else None,
    }


def _category_fits(sample: Sample, w, mu, sigma) -> list[dict[str, Any]]:
    rows, nu, _, _, _ = (x[0] for x in sample.stats(sample.count[None, :]))
    return [{"category": str(name), "rows": int(rows[g]),
             "truncated": int(rows[g] - nu[g]), "share": round(float(w[0, g]), 4),
             "pooled_fallback": bool(nu[g] < MIN_UNCENSORED),
             "median_tokens": round(float(np.exp(mu[0, g])), 1),
             "mu": round(float(mu[0, g]), 4), "sigma": round(float(sigma[0, g]), 4)}
            for g, name in enumerate(sample.categories)]


def _fit_gap(sample: Sample, w, mu, sigma, cap: int) -> tuple[Optional[float], bool]:
    """(largest |KM - model| of P(L > C) below the cap, whether it is beyond noise).

    A gap counts as real only where it exceeds both FIT_GAP_WARN and the KM's own 90%
    half-width: a small sample's KM wobbles by more than 2% on its own.
    """
    observed = sample.tokens[~sample.censored]
    if observed.size < 10:
        return None, False
    grid = np.unique(np.append(np.quantile(observed, np.linspace(0.1, 0.9, 9)), cap))
    km = kaplan_meier(sample.tokens, sample.censored, grid, cap)
    model, _ = _predict(w[:1], mu[:1], sigma[:1], grid.astype(float))
    pairs = [(abs(k[0] - p), (k[2] - k[1]) / 2) for k, p in zip(km, model[0]) if k]
    gap = max(g for g, _ in pairs)
    return gap, any(g > max(FIT_GAP_WARN, half) for g, half in pairs)


DEFAULT_CAPS = (2048, 3072, 4096, 5120, 6144, 8192, 12288, 16384, 32768)
METHOD = "lognormal censored MLE, per-category mix"


def default_caps(cap: Optional[int]) -> list[int]:
    if cap is None:
        return list(DEFAULT_CAPS)
    return sorted({c for c in DEFAULT_CAPS if cap / 2 <= c <= cap * 8} | {cap})


def _notes(cap: int, sample: Sample) -> list[str]:
    notes = [
        f"Rows cut at their budget are right-censored (true length > budget), not lengths "
        f"equal to it; fitted by censored maximum likelihood (log-length normal per "
        f"category, mixed by row share). Ranges: {CI[0]:g}th-{CI[1]:g}th percentile of a "
        f"row bootstrap.",
        f"Caps above {cap} are EXTRAPOLATIONS of the fitted lognormal shape: no length "
        f"beyond {cap} was observed. Kaplan-Meier (nonparametric) figures exist only for "
        f"caps <= {cap}.",
        "Relative GPU time = expected output tokens per row / that at the current cap "
        "(decode-bound; prefill is equal at every cap). Longer sequences cost a little more "
        "per token, so raising the cap costs somewhat more than shown.",
    ]
    if sample.n_abort:
        notes.append(f"{sample.n_abort} aborted rows are left out of the fit.")
    return notes


def _parametric_rows(w, mu, sigma, caps: list[int], cap: int, km: list,
                     n_boot: int) -> list[dict[str, Any]]:
    """Rows from the fits: row 0 of w/mu/sigma is the point estimate, the rest resamples."""
    grid = np.array(sorted(set(caps) | {cap}), dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        trunc, mean = _predict(w, mu, sigma, grid)
        now = mean[:, [int(np.searchsorted(grid, cap))]]
        rel = mean / now
    stacked = np.stack([trunc, mean, rel, mean - now], axis=-1)      # (B+1, caps, 4)
    boot = stacked[1:] if n_boot else np.full((1,) + stacked.shape[1:], np.nan)
    with warnings.catch_warnings():  # a resample with no rows yields NaN: ignored
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = np.nanpercentile(boot, CI, axis=0)
    rows = []
    for c, k in zip(caps, km):
        i = int(np.searchsorted(grid, c))
        method = METHOD + (f"; extrapolated above observed cap {cap}" if c > cap else "")
        rows.append(_row(c, stacked[0, i], lo[i], hi[i], k, c > cap, method))
    return rows


def add_gpu_hours(out: dict[str, Any], tokens_per_gpu_h: Optional[float],
                  unit: str = gpu_hours.GPU_UNIT, price: Optional[float] = None) -> None:
    """Per what-if row, at the run's measured rate: ``gpu_hours_per_1k_rows`` at that
    cap and, above the current cap, ``continue_gpu_hours`` (+ range and cost): what
    continuing this run's truncated rows to it costs."""
    out.update(gpu_unit=unit, output_tok_per_gpu_h=tokens_per_gpu_h, price_per_gpu_h=price)
    n, cap = out["rows_fitted"], out["current_cap"]
    for row in out["rows"]:
        per = gpu_hours.hours_for(row["mean_tokens"], tokens_per_gpu_h) \
            if row["mean_tokens"] is not None else None
        row["gpu_hours_per_1k_rows"] = rounded(None if per is None else 1000 * per, 4)
        above = row["cap"] > (cap or 0)
        for suffix in ("", "_lo", "_hi"):
            extra = row.get("extra_tokens_per_row" + suffix)
            hours = (gpu_hours.hours_for(n * extra, tokens_per_gpu_h)
                     if above and extra is not None else None)
            row["continue_gpu_hours" + suffix] = rounded(hours, 4)
        row["continue_cost"] = rounded(gpu_hours.cost(row["continue_gpu_hours"], price), 2)


def forecast_report(df: pd.DataFrame, caps: Optional[Sequence[int]] = None,
                    n_boot: int = N_BOOT, seed: int = 0,
                    trainer_max_lengths: Sequence[int] = (),
                    tokens_per_gpu_h: Optional[float] = None,
                    gpu_unit: str = gpu_hours.GPU_UNIT,
                    price: Optional[float] = None) -> dict[str, Any]:
    """The what-if over caps, with fit details and notes (see the module docstring).

    df: the run's rows (finish_reason, completion_tokens; category, max_new_tokens,
    key/version optional). Several versions of a key are reduced to the latest
    (run_index.latest_rows). trainer_max_lengths: also each cap's expected trainable
    tokens per row at these trainer max lengths (needs prompt_tokens; token_yield.py).
    tokens_per_gpu_h: the run's measured rate (progress.json's gpu_hours): each row then
    says its GPU-hours (add_gpu_hours); None: not measured, those fields are null.
    """
    df = latest_rows(df)
    sample, cap = Sample(df), current_cap(df)
    caps = sorted({int(c) for c in (caps or default_caps(cap))})
    out: dict[str, Any] = {
        "current_cap": cap, "caps": caps, "method": METHOD, "rows_fitted": sample.n,
        "truncated_rows": int(sample.censored.sum()), "abort_rows_excluded": sample.n_abort,
        "n_boot": n_boot, "ci_percentiles": list(CI), "categories": [], "fit_gap": None,
        "rows": [], "notes": []}
    if sample.n == 0 or cap is None:
        out["notes"].append("No finished (stop/length) rows: nothing to forecast.")
        add_gpu_hours(out, tokens_per_gpu_h, gpu_unit, price)
        return out
    out["notes"] = _notes(cap, sample)
    km = kaplan_meier(sample.tokens, sample.censored, caps, cap)
    if (~sample.censored).sum() < 2:
        out["notes"].append(
            "Every row (or all but one) hit its budget: no length distribution can be fitted, "
            "only Kaplan-Meier below the cap. Run a pilot at a higher cap.")
        empty = (None, None, None)
        out["rows"] = [_row(c, empty, empty, empty, k, c > cap, "kaplan-meier only")
                       for c, k in zip(caps, km)]
        add_gpu_hours(out, tokens_per_gpu_h, gpu_unit, price)
        return out
    w, mu, sigma = _bootstrap_fit(sample, n_boot, seed)
    out["rows"] = _parametric_rows(w, mu, sigma, caps, cap, km, n_boot)
    add_gpu_hours(out, tokens_per_gpu_h, gpu_unit, price)
    if tokens_per_gpu_h:
        out["notes"].append(
            f"GPU-hours at the run's measured {gpu_hours.fmt_rate(tokens_per_gpu_h)} output "
            f"tokens per {gpu_unit} held (start-up, ramp and tail included): per 1,000 rows "
            f"at each cap, and what continuing this run's truncated rows to a larger cap "
            f"costs (--continue-truncated --max-total-tokens C: the expected extra output "
            f"tokens; re-prefilling their prompt + earlier output comes on top).")
    if trainer_max_lengths and "prompt_tokens" in df.columns:
        fitted = df[df["finish_reason"].astype(str).isin(("stop", "length"))]
        for row, entry in zip(out["rows"], trainable_forecast(
                fitted, sample.categories, mu, sigma, caps, cap, trainer_max_lengths, CI)):
            row["trainable"] = entry
        out["notes"].append(
            "Trainable tokens per row at trainer max length N: min(L, cap, N - prompt) "
            "(rows cut at the cap kept, --include-truncated) and min(L, N - prompt) for "
            "rows finished within the cap (the export's default); a row's own length "
            "where it is known at that cap, the fit given its cut where it is not.")
    out["categories"] = _category_fits(sample, w, mu, sigma)
    thin = [f["category"] for f in out["categories"] if f["pooled_fallback"]]
    if thin:
        out["notes"].append(
            f"Categories with < {MIN_UNCENSORED} finished rows use the pooled fit: "
            f"{', '.join(thin[:10])}{' ...' if len(thin) > 10 else ''}. If they are mostly "
            f"truncated, their lengths are underestimated.")
    gap, real = _fit_gap(sample, w, mu, sigma, cap)
    out["fit_gap"] = None if gap is None else round(float(gap), 4)
    if real:
        out["notes"].append(
            f"Fit check: the lognormal misses the Kaplan-Meier curve by up to {gap:.1%} "
            f"below the cap, beyond sampling noise; treat the extrapolations with caution.")
    return out


def forecast(df: pd.DataFrame, caps: Sequence[int], n_boot: int = N_BOOT,
             seed: int = 0) -> list[dict[str, Any]]:
    """Per cap: cap, truncated_fraction(+_lo/_hi), mean_tokens(+_lo/_hi),
    relative_gpu_time(+_lo/_hi), method, extrapolated, km_* (None above the cap)."""
    return forecast_report(df, caps, n_boot=n_boot, seed=seed)["rows"]
