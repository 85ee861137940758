"""``--continue-truncated --max-total-tokens T``: finish what the budget cut, exactly.

For every key whose latest version ended by length below T, send prompt ids + output
ids (as ids: never re-tokenized, never re-templated) with budget T - generated, and
write the result as the row's next version: the whole output, counts added up,
budget_history extended. No generated token is thrown away; finished rows are not
touched. Reruns continue only what is still truncated below T (idempotent).
"""

from __future__ import annotations

import collections
import logging
from typing import Optional

import numpy as np
import pyarrow as pa
import ray
import ray.data

from jobs.pipeline import chain as pipeline
from jobs.config import RunConfig
from jobs.io.digests import sorted_contains
from jobs.io.run_index import RunIndex, data_row_digests, version_digests
from jobs.io.run_store import RunStore
from jobs.pipeline.settings import StageSettings
from jobs.runs.errors import RunError

logger = logging.getLogger("raygen")


def to_continue(index: RunIndex, total: int,
                settings_hash: Optional[str] = None) -> np.ndarray:
    """Sorted row digests (run_index.version_digests) of the latest versions to
    continue: cut by length below ``total`` tokens. Refuses rows made under other
    settings (continuing them with this config's sampling/template would splice two
    outputs)."""
    latest = index.latest
    chosen = np.flatnonzero((latest["finish"] == index.code_of_finish("length"))
                            & (latest["tokens"] < total))
    if settings_hash is not None and len(chosen):
        check_settings_of(index.settings_of(chosen), settings_hash)
    return np.sort(version_digests(latest["digest"][chosen], latest["version"][chosen]))


def check_settings_of(hashes: list[Optional[str]], settings_hash: str) -> None:
    """hashes: the settings_hash of each row to continue."""
    other = collections.Counter(h for h in hashes if h != settings_hash)
    if other:
        listed = ", ".join(f"{h} ({n} rows)" for h, n in sorted(other.items(), key=str))
        raise RunError(
            f"{sum(other.values())} truncated rows were generated with other settings "
            f"({listed}) than this config ({settings_hash}: model, sampling, chat template, "
            f"reasoning parser, think token, engine args, context policy). Continuing them "
            f"would splice outputs of two settings; continue with the config that made them.")


def _select(batch: pa.Table, wanted: np.ndarray) -> pa.Table:
    return batch.filter(pa.array(sorted_contains(wanted, data_row_digests(batch))[0]))


def parts_to_read(index: RunIndex, wanted: np.ndarray) -> list[str]:
    """The data parts holding the latest versions to continue (no other part is read)."""
    latest = index.latest
    rows = sorted_contains(wanted, version_digests(latest["digest"], latest["version"]))[0]
    return sorted({index.part_paths[p] for p in np.unique(latest["part"][rows])})


def build(cfg: RunConfig, store: RunStore, parts: list[str], wanted: np.ndarray,
          stage: StageSettings) -> ray.data.Dataset:
    """Continue the ``wanted`` rows, read from ``parts`` (parts_to_read), to
    ``stage.continue_to`` tokens."""
    # read_parquet needs a file even when nothing is left to continue: _select keeps no row
    ds = ray.data.read_parquet(parts or store.part_paths("data")[:1], filesystem=store.root.fs,
                               num_cpus=pipeline.LIGHT_CPU, concurrency=pipeline.LIGHT_TASKS)
    ds = ds.map_batches(_select, batch_format="pyarrow", fn_kwargs={"wanted": wanted},
                        num_cpus=pipeline.LIGHT_CPU, compute=pipeline.light_tasks(),
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
