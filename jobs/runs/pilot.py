"""``--pilot N``: size the budget before the full run.

Draws about N valid prompts stratified by category (jobs.analysis.forecast.pilot_sample), writes
them as ``<output>/<run>-pilot/input.jsonl``, and returns a config for the run
``<run>-pilot`` over that file. Run it at a high cap (``--set job.max_new_tokens=16384``)
so few rows are censored; its report's what-if table then says what each cap would
cut and cost on the full set.
"""

from __future__ import annotations

import pandas as pd

from jobs.config import RunConfig
from jobs.analysis.forecast import pilot_sample
from jobs.io.sources import iter_rows
from jobs.io.storage import locate, write_bytes_atomic
from jobs.pipeline.validate import RowError, parse_row


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
