"""``--continue-truncated --max-total-tokens T``: finish what the budget cut, exactly.

For every key whose latest version ended by length below T, send prompt ids + output
ids (as ids: never re-tokenized, never re-templated) with budget T - generated, and
write the result as the row's next version: the whole output, counts added up,
budget_history extended. No generated token is thrown away; finished rows are not
touched. Reruns continue only what is still truncated below T (idempotent).
"""

from __future__ import annotations

import logging
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc
import ray
import ray.data

from jobs.pipeline import chain as pipeline
from jobs.config import RunConfig
from jobs.io.run_store import RunStore
from jobs.pipeline.settings import StageSettings
from jobs.runs.errors import RunError

logger = logging.getLogger("raygen")


def latest_versions(store: RunStore) -> pa.Table:
    """key, version, finish_reason, completion_tokens of each key's latest version."""
    t = store.read_kind("data", ["key", "version", "finish_reason", "completion_tokens"])
    if not t.num_rows:
        return t
    t = t.sort_by([("key", "ascending"), ("version", "descending")])
    keys = t.column("key").to_pylist()
    first = [i == 0 or keys[i] != keys[i - 1] for i in range(len(keys))]
    return t.filter(pa.array(first))


def to_continue(store: RunStore, total: int, settings_hash: Optional[str] = None) -> set[str]:
    """key#version of every row to continue; refuses rows made under other settings
    (continuing them with this config's sampling/template would splice two outputs)."""
    latest = latest_versions(store)
    if not latest.num_rows:
        return set()
    mask = pc.and_(pc.equal(latest.column("finish_reason"), "length"),
                   pc.less(latest.column("completion_tokens"), total))
    chosen = latest.filter(mask)
    wanted = {f"{k}#{v}" for k, v in zip(chosen.column("key").to_pylist(),
                                         chosen.column("version").to_pylist())}
    if settings_hash is not None and wanted:
        check_settings_of(store, wanted, settings_hash)
    return wanted


def check_settings_of(store: RunStore, wanted: set[str], settings_hash: str) -> None:
    t = store.read_kind("data", ["key", "version", "settings_hash"])
    other: dict[str, int] = {}
    for k, v, h in zip(*(c.to_pylist() for c in t.columns)):
        if f"{k}#{v}" in wanted and h != settings_hash:
            other[h] = other.get(h, 0) + 1
    if other:
        hashes = ", ".join(f"{h} ({n} rows)" for h, n in sorted(other.items()))
        raise RunError(
            f"{sum(other.values())} truncated rows were generated with other settings "
            f"({hashes}) than this config ({settings_hash}: model, sampling, chat template, "
            f"reasoning parser, think token, engine args, context policy). Continuing them "
            f"would splice outputs of two settings; continue with the config that made them.")


def _select(batch: pa.Table, wanted: set[str]) -> pa.Table:
    ids = [f"{k}#{v}" for k, v in zip(batch.column("key").to_pylist(),
                                       batch.column("version").to_pylist())]
    return batch.filter(pa.array([i in wanted for i in ids]))


def build(cfg: RunConfig, store: RunStore, wanted: set[str],
          stage: StageSettings) -> ray.data.Dataset:
    """The data/ rows in ``wanted``, continued to ``stage.continue_to`` tokens."""
    ds = ray.data.read_parquet(store.part_paths("data"), filesystem=store.root.fs,
                               num_cpus=pipeline.LIGHT_CPU, concurrency=pipeline.LIGHT_TASKS)
    ds = ds.map_batches(_select, batch_format="pyarrow", fn_kwargs={"wanted": wanted},
                        num_cpus=pipeline.LIGHT_CPU, concurrency=pipeline.LIGHT_TASKS,
                        batch_size=cfg.job.batch_size)
    return pipeline.generate(ds, cfg, stage)


def check_total(cfg: RunConfig, total: Optional[int]) -> int:
    if total is None:
        raise RunError("--continue-truncated needs --max-total-tokens N: the new total output "
                       "budget per row (e.g. 8192)")
    if total >= cfg.engine.context_length:
        raise RunError(f"--max-total-tokens {total} cannot fit engine.context_length "
                       f"{cfg.engine.context_length} together with any prompt")
    return total
