"""The admit stage (stage 3 of the job): a stateless Ray Data filter over the admission
table the driver's pass made (jobs/pipeline/admission.py, jobs/pipeline/admission_table.py).

Row contract: reads validate's rows (``ADMIT_INPUTS``: key, ordinal, reject_reason,
checked per batch) and passes on, whole, exactly the rows the table chose: a row whose
key digest is in the table with that row's ordinal. With job.samples_per_prompt n > 1
each admitted input row becomes one row per admitted sample, with its ``sample`` and
``seed`` columns, the samples of a prompt next to each other. With a sampling mix each
row kept also gets its ``setting`` (drawn per (key, sample)). No actor, nothing counted
twice, nothing to lose when a worker dies: whatever Ray re-executes gets the same rows.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from jobs.io.digests import digests_of
from jobs.io.samples import sample_digests, sample_seed
from jobs.pipeline.admission_table import AdmissionTable
from jobs.pipeline.sampling_mix import with_settings
from jobs.pipeline.stage_inputs import StageInputs

ADMIT_INPUTS = StageInputs("admit", {
    "key": "the row's key, looked up in the table as its digest",
    "ordinal": "the row's place in the input: the table holds each key's chosen one",
    "reject_reason": "validate's verdict: a rejected row never passes"})


_TABLES: dict[str, AdmissionTable] = {}


def _table_of(holder: list) -> AdmissionTable:
    """The table behind the ObjectRef, fetched once per worker (zero-copy numpy)."""
    import ray
    ref = holder[0]
    key = ref.hex()
    if key not in _TABLES:
        _TABLES.clear()
        _TABLES[key] = ray.get(ref)
    return _TABLES[key]


def admit_batch(batch: pa.Table, table: list,
                mix: Sequence[tuple[str, float]] = ()) -> pa.Table:
    """map_batches function: keep exactly the rows the admission table chose.

    ``table`` is ``[ObjectRef(AdmissionTable)]`` (a list, so Ray hands the ref over
    unresolved and each worker fetches it once). ``mix``: (name, weight) of each setting
    of a sampling mix: each row kept gets its ``setting``, drawn from its identity and
    the table's salt (jobs/pipeline/sampling_mix.py)."""
    ADMIT_INPUTS.check(batch)
    admitted = _table_of(table) if isinstance(table, list) else table
    valid = batch.column("reject_reason").is_null().to_numpy(zero_copy_only=False)
    digests = digests_of(batch.column("key").to_pylist(), admitted.salt)
    ordinals = batch.column("ordinal").to_numpy(zero_copy_only=False).astype(np.int64)
    if admitted.samples > 1:
        out = _expand(batch, admitted, digests, ordinals, valid)
    else:
        out = batch.filter(pa.array(admitted.admits(digests, ordinals) & valid))
    return with_settings(out, mix, admitted.salt) if mix else out


def _expand(batch: pa.Table, admitted: AdmissionTable, digests: np.ndarray,
            ordinals: np.ndarray, valid: np.ndarray) -> pa.Table:
    """One row per admitted (row, sample), a prompt's samples side by side (sent close
    together, the later ones may find its prefix in the engine's cache), with the
    ``sample`` and ``seed`` columns."""
    rows, samples = [], []
    for s in range(admitted.samples):
        hit = np.flatnonzero(admitted.admits(sample_digests(digests, s), ordinals) & valid)
        rows.append(hit)
        samples.append(np.full(len(hit), s, np.int32))
    rows_at, sample_of = np.concatenate(rows), np.concatenate(samples)
    order = np.lexsort((sample_of, rows_at))
    rows_at, sample_of = rows_at[order], sample_of[order]
    out = batch.take(pa.array(rows_at, pa.int64()))
    keys = out.column("key").to_pylist()
    seeds = [sample_seed(admitted.salt, k, int(s)) for k, s in zip(keys, sample_of)]
    return (out.append_column("sample", pa.array(sample_of, pa.int32()))
            .append_column("seed", pa.array(seeds, pa.int64())))
