"""``--continue-truncated --max-total-tokens T``: finish what the budget cut, exactly.

For every key whose latest version ended by length below T, send prompt ids + output
ids (as ids: never re-tokenized, never re-templated) with budget T - generated, and
write the result as the row's next version: the whole output, counts added up,
budget_history extended. No generated token is thrown away; finished rows are not
touched. Reruns continue only what is still truncated below T (idempotent). The rows
are read by their place in the run index (its winners), never filtered from whole
parts, so a row stored twice is continued once.
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
from jobs.io.run_index import RunIndex, version_digests
from jobs.io.run_store import RunStore
from jobs.io.schema import DATA
from jobs.pipeline.settings import StageSettings
from jobs.pipeline.stage_inputs import StageInputs
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


def rows_to_read(index: RunIndex, wanted: np.ndarray) -> dict[str, list[int]]:
    """data part path -> the row positions in it of the ``wanted`` latest versions: the
    index's winners only, so a (key, version) written twice (a part rewritten after a
    crash, a copy) is still sent once. Only these parts are read."""
    latest = index.latest
    rows = np.flatnonzero(sorted_contains(wanted, version_digests(latest["digest"],
                                                                 latest["version"]))[0])
    chosen: dict[str, list[int]] = collections.defaultdict(list)
    for part, row in zip(latest["part"][rows].tolist(), latest["row"][rows].tolist()):
        chosen[index.part_paths[part]].append(row)
    return {path: sorted(rows) for path, rows in sorted(chosen.items())}


READ_INPUTS = StageInputs("continue: read rows", {
    "path": "a data part's path", "rows": "the positions of its rows to read"})


def _read_rows(batch: pa.Table, run_uri: str, storage) -> pa.Table:
    """map_batches: each (path, rows) item -> those rows of that data part."""
    READ_INPUTS.check(batch)
    store = RunStore(run_uri, storage)
    tables = [store.read_part(path).take(pa.array(rows, pa.int64()))
              for path, rows in zip(batch.column("path").to_pylist(),
                                    batch.column("rows").to_pylist())]
    tables = [t for t in tables if t.num_rows]  # a part quarantined since: not done
    return pa.concat_tables(tables) if tables else DATA.empty_table()


def build(cfg: RunConfig, store: RunStore, rows: dict[str, list[int]],
          stage: StageSettings) -> ray.data.Dataset:
    """Continue the chosen rows (rows_to_read) to ``stage.continue_to`` tokens (or, in a
    regenerate run, send their prompts again: jobs/runs/regenerate.py)."""
    if not rows:  # nothing to continue: an empty dataset of data/ rows
        return pipeline.generate(ray.data.from_arrow(DATA.empty_table()), cfg, stage)
    items = [{"path": path, "rows": positions} for path, positions in rows.items()]
    ds = ray.data.from_items(items).map_batches(
        _read_rows, batch_format="pyarrow", batch_size=1,
        fn_kwargs={"run_uri": store.uri, "storage": cfg.storage},
        num_cpus=pipeline.LIGHT_CPU, compute=pipeline.light_tasks())
    return pipeline.generate(ds, cfg, stage)


def check_total(cfg: RunConfig, total: Optional[int]) -> int:
    if total is None:
        raise RunError("--continue-truncated needs --max-total-tokens N: the new total output "
                       "budget per row (e.g. 8192)")
    if total >= cfg.engine.context_length:
        raise RunError(f"--max-total-tokens {total} cannot fit engine.context_length "
                       f"{cfg.engine.context_length} together with any prompt")
    return total
