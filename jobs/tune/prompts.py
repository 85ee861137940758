"""A sample of the run's own prompts for the sweep.

The prompts decide the KV pool's load (prompt lengths) and the output lengths, so the
sweep runs the run's own: the valid rows of ``job.input`` (or ``--prompts FILE``), read
up to ``SCAN_PER_PROMPT`` x the sample's size (a 900K-row input is not read whole for a
few minutes' sweep: the sample is of its first rows), then stratified by category as a
pilot is (jobs/runs/pilot.py), so every category is in it.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import pandas as pd

from jobs.config import RunConfig
from jobs.io.sources import iter_rows
from jobs.io.storage import locate
from jobs.pipeline.validate import RowError, parse_row
from jobs.runs.pilot import pilot_sample
from jobs.tune.plan import TuneRefused

SCAN_PER_PROMPT = 50


def sample_prompts(cfg: RunConfig, n: int, path: Optional[str] = None,
                   seed: int = 0) -> list[dict[str, Any]]:
    """About n prompts ({category, messages, tools}, as the generate stage sends them);
    TuneRefused when the
    input cannot be read or holds no valid prompt."""
    uris = [path] if path else list(cfg.job.input)
    rows, rejected, first_problem, scanned = [], 0, None, 0
    for uri in uris:
        try:
            for _, raw, problem in iter_rows(locate(uri, cfg.storage), None,
                                             cfg.job.max_line_bytes):
                scanned += 1
                try:
                    parsed = parse_row(raw, problem)
                except RowError as exc:
                    rejected += 1
                    first_problem = first_problem or f"{uri} row {scanned}: {exc}"
                    continue
                rows.append({"category": parsed["category"], "row": {
                    "category": parsed["category"], "messages": json.loads(parsed["messages"]),
                    "tools": json.loads(parsed["tools"]) if parsed["tools"] else None}})
                if len(rows) >= SCAN_PER_PROMPT * n:
                    break
        except (OSError, ValueError) as exc:
            source = "--prompts" if path else "job.input"
            raise TuneRefused(f"{source} {uri}: cannot be read ({exc})") from None
        if len(rows) >= SCAN_PER_PROMPT * n:
            break
    if not rows:
        raise TuneRefused(f"no valid prompt to sample in {', '.join(uris)} ({scanned} rows "
                          f"read, {rejected} invalid" + (f"; first: {first_problem}"
                                                          if first_problem else "") + ")")
    picked = pilot_sample(pd.DataFrame(rows), n, by="category", seed=seed)
    return list(picked["row"])
