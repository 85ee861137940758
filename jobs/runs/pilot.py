"""``--pilot N``: size the budget before the full run.

Draws about N valid prompts stratified by category (``pilot_sample``), writes them as
``<output>/<run>-pilot/input.jsonl``, and returns a config for the run ``<run>-pilot``
over that file. Run it at a high cap (``--set job.max_new_tokens=16384``)
so few rows are censored; its report's what-if table then says what each cap would
cut and cost on the full set.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from jobs.config import RunConfig
from jobs.io.sources import iter_rows
from jobs.io.storage import locate, write_bytes_atomic
from jobs.pipeline.validate import RowError, parse_row

# At least this many prompts per category (or all of a smaller one): every category
# gets a length estimate from the pilot.
MIN_PILOT_PER_GROUP = 5


def _allocate(sizes: pd.Series, n: int, floor_n: int) -> pd.Series:
    """Quotas summing to n: each group min(floor_n, size), the rest proportional.

    Water-filling: groups whose proportional share is below their floor get the floor;
    the others share what is left in proportion to their size (largest remainder).
    """
    floor = sizes.clip(upper=floor_n)
    if floor.sum() >= n:        # the floors win over n: every category is seen
        return floor
    fixed = pd.Series(False, index=sizes.index)
    while True:
        left = n - floor[fixed].sum()
        share = left * sizes[~fixed] / sizes[~fixed].sum()
        below = share < floor[~fixed]
        if not below.any():
            break
        fixed[below[below].index] = True
    quota = floor.where(fixed, 0).astype(int)
    base = np.floor(share).astype(int)
    quota[share.index] = base
    extra = int(left - base.sum())   # largest remainders get one more row
    order = (share - base).sort_values(ascending=False, kind="stable").index[:extra]
    quota[order] += 1
    return quota


def pilot_sample(df_prompts: pd.DataFrame, n: int, by: str = "category",
                 seed: int = 0, min_per_group: int = MIN_PILOT_PER_GROUP) -> pd.DataFrame:
    """About n prompts, stratified by `by`, for a pilot run at a high cap (few censored).

    Proportional, but at least min_per_group per group (or all of a smaller group) so
    every category gets a length estimate; floors may push the total above n. Input
    order is kept; missing `by` values form the group "none".
    """
    if n >= len(df_prompts):
        return df_prompts.copy()
    groups = (df_prompts[by].fillna("none").astype(str) if by in df_prompts.columns
              else pd.Series("none", index=df_prompts.index))
    sizes = groups.value_counts().sort_index()  # sorted: same seed -> same sample
    quota = _allocate(sizes, n, min_per_group)
    rng = np.random.default_rng(seed)
    picks = [rng.choice(np.flatnonzero((groups == name).to_numpy()), int(k), replace=False)
             for name, k in quota.items()]
    return df_prompts.iloc[np.sort(np.concatenate(picks))].copy()


def _valid_rows(cfg: RunConfig) -> pd.DataFrame:
    rows = []
    for uri in cfg.job.input:
        for _, raw, problem in iter_rows(locate(uri, cfg.storage), None, cfg.job.max_line_bytes):
            try:
                category = parse_row(raw, problem)["category"]
            except RowError:
                continue  # the full run reports rejects; a pilot just skips them
            rows.append({"category": category, "raw": raw})
    return pd.DataFrame(rows, columns=["category", "raw"])


def pilot_config(cfg: RunConfig, n: int, seed: int = 0) -> RunConfig:
    sample = pilot_sample(_valid_rows(cfg), n, by="category", seed=seed)
    run_name = f"{cfg.job.run_name}-pilot"
    target = f"{cfg.job.output.rstrip('/')}/{run_name}/input.jsonl"
    body = "".join(raw + "\n" for raw in sample["raw"])
    write_bytes_atomic(locate(target, cfg.storage), body.encode())
    job = cfg.job.model_copy(update={"input": [target], "run_name": run_name, "limit": None})
    return cfg.model_copy(update={"job": job})
