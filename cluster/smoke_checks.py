"""What a smoke phase must show before a GPU node is trusted with the run (cluster/gpu_smoke.py).

Each check reads what the phase really produced (its data/failures rows, the engine's
/server_info and /metrics) against the config the user will run, and answers with one
line naming the check and the figure, or nothing. ``failed`` returns every failing
line; the script exits 1 when there is any. The checks:

- ``rows``: every prompt came back as a data row with a finish reason; no failure rows.
- ``accept_length``: with speculative decoding on, tokens per verify step (the rows'
  spec_verify_ct; prefilled tokens left out, as SGLang's scheduler counts) present and
  above 1: a drafter that accepts nothing costs its draft passes and gains no token.
- ``flagged``: no row carries an integrity flag (contract/integrity.py): loops, no think
  end, empty outputs on the engine the user is about to trust.
- ``capacity``: the engine's effective running-request cap (its scheduler's, from
  /server_info) is the config's, and its KV pool (max_total_num_tokens) holds that many
  of the rows the job keeps in flight per engine at the config's budget (the median
  prompt + max_new_tokens each).
- ``retractions``: the engine retracted no request while the phase ran (the increase of
  sglang:num_retracted_requests_total over it: a smoke attached to a running engine must
  not be charged that engine's earlier retractions): a retracted request is prefilled
  again, the symptom of a pool planned too small.

One GPU per replica is not checked here: each replica checks it before its engine starts
(serve_apps/gpu_pinning.py) and refuses to start otherwise, which the phase shows as an
engine that never came up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

from jobs.config import RunConfig, rows_per_replica
from serve_apps.engine_client import effective_running_cap

CHECKS = ("rows", "accept_length", "flagged", "capacity", "retractions")
RETRACTIONS = "sglang:num_retracted_requests_total"


@dataclass
class Phase:
    """What one smoke phase produced."""

    cfg: RunConfig
    prompts: int                 # rows sent
    data: pd.DataFrame           # the run's data rows
    failures: int                # its failure rows
    server_info: dict[str, Any]  # one engine's /server_info
    metrics_text: str            # that engine's /metrics (Prometheus text) after the phase
    metrics_before: str = ""     # ... and before it ("": an engine started for the phase)


def rows_in_flight_per_engine(cfg: RunConfig) -> int:
    job = cfg.job
    share = rows_per_replica(job.max_actors * job.inflight_rows_per_actor,
                             cfg.serve.autoscaling.min_replicas)
    return min(share, cfg.serve.max_ongoing_requests)


def counter_total(metrics_text: str, name: str) -> Optional[float]:
    """The sum of a counter's samples over its labels; None when the engine has none."""
    values = [sample.value for family in text_string_to_metric_families(metrics_text)
              for sample in family.samples if sample.name == name]
    return sum(values) if values else None


def counter_increase(before_text: str, after_text: str, name: str) -> Optional[float]:
    """How much a counter grew between two scrapes of one engine; None when the engine has
    none. An engine that restarted in between (its counter below the first scrape's)
    counts from zero."""
    after = counter_total(after_text, name)
    before = counter_total(before_text, name) if before_text else None
    if after is None or before is None or after < before:
        return after
    return after - before


def accept_length(data: pd.DataFrame) -> Optional[float]:
    """Tokens per verify step as SGLang's scheduler counts them (its log's "accept len",
    sglang:spec_accept_length): over the verify steps' tokens only. The first token of a
    request, and of each continuation, comes from its prefill: counted in (as the rows'
    accept_length is, like SGLang's meta_info), a draft that never agrees still shows
    n / (n - 1) > 1 and would pass (seen on SGLang's CPU engine). None: no row reports
    verify steps."""
    if "spec_verify_ct" not in data or data.empty:
        return None
    verify = data.spec_verify_ct.fillna(0)
    if not (verify > 0).any():
        return None
    prefilled = 1 + (data.continuations.fillna(0) if "continuations" in data else 0)
    spec = verify > 0
    return float((data.completion_tokens - prefilled)[spec].sum() / verify[spec].sum())


def failed(phase: Phase) -> list[str]:
    cfg, data = phase.cfg, phase.data
    lines: list[str] = []
    unfinished = int(data.finish_reason.isna().sum()) if len(data) else 0
    if len(data) != phase.prompts or phase.failures or unfinished:
        lines.append(f"rows: {len(data)} of {phase.prompts} prompts came back as rows "
                     f"({phase.failures} failure rows, {unfinished} without a finish reason)")
    if cfg.engine.speculative is not None:
        accept = accept_length(data)
        if accept is None or accept <= 1.0:
            lines.append(f"accept_length: speculative decoding ({cfg.engine.speculative.algorithm}) "
                         f"is on and the rows' accept length is {accept} (must be above 1)")
    if len(data) and "integrity_flags" in data:
        flagged = data[data.integrity_flags.map(lambda f: f is not None and len(f) > 0)]
        if len(flagged):
            kinds = sorted({f for flags in flagged.integrity_flags for f in flags})
            lines.append(f"flagged: {len(flagged)} of {len(data)} rows carry integrity flags "
                         f"({', '.join(kinds)})")
    lines += _capacity(phase)
    retracted = counter_increase(phase.metrics_before, phase.metrics_text, RETRACTIONS)
    if retracted:
        lines.append(f"retractions: the engine retracted {retracted:.0f} requests "
                     f"({RETRACTIONS}): its KV pool cannot hold the rows in flight")
    return lines


def _capacity(phase: Phase) -> list[str]:
    cfg, info = phase.cfg, phase.server_info
    rows = rows_in_flight_per_engine(cfg)
    lines = []
    cap = effective_running_cap(info)
    planned = cfg.engine.planned_max_running_requests
    # more rows in flight than running slots is the plan (a queue refills a finished
    # slot at once); fewer slots than the config plans is not
    running = min(rows, planned if cap is None else cap)
    if cap is not None and cap < planned:
        lines.append(f"capacity: the engine runs at most {cap} requests, the config plans "
                     f"{planned} (engine.max_running_requests) for the {rows} rows in "
                     f"flight per engine")
    pool = info.get("max_total_num_tokens")
    prompt = float(phase.data.prompt_tokens.median()) if len(phase.data) else 0.0
    need = running * (prompt + cfg.job.max_new_tokens)
    if pool is not None and need > int(pool):
        lines.append(f"capacity: {running} running requests at the budget "
                     f"({prompt:.0f} prompt + {cfg.job.max_new_tokens} output tokens each, "
                     f"{need:.0f} tokens) do not fit the engine's KV pool of {int(pool)} tokens")
    return lines
