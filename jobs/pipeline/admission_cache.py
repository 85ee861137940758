"""The admission pass, reused while the inputs are unchanged or only grew.

A resume of a 900K-line input used to re-read and re-validate every line on the driver
before the first request (24-45 s), to learn what the last session already knew. After
every pass the driver records what it found in the input alone, independent of what
the run holds:

    <run>/admission/keys.arrow   every valid distinct key (sorted salted digest, the
                                 ordinal of its first occurrence, its occurrences), and
                                 in the schema metadata: the identity below, each
                                 file's fingerprint (rows, sha256, newlines), the
                                 reject count and every reject id

The next session goes on from it (``admit_inputs(..., recorded=...)``) and decides
against the run's index exactly as a whole pass would: a file whose size and
modification time are unchanged is not read at all; the last file, grown (lines
appended: JSONL ending in a newline), and files added after it are read, but only the
new lines are parsed, and the grown file's old bytes must still hash to the recorded
sha256 (else PrefixChanged: a whole pass runs). Anything else that could change a
verdict means a whole pass: another file list or order, a changed file, job.limit (with
one, only unchanged inputs reuse), job.max_line_bytes, the run's key salt, the source of
the modules that decide a verdict (an upgrade that changes validation), a recorded
reject id not in rejects/ yet (the recording session died before writing it), an
unreadable record. The one case the cheap check misses is a file rewritten to the same
size within the store's mtime resolution: delete keys.arrow to force a whole pass.
Inputs with more than MAX_REJECT_IDS rejects are not recorded.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
from functools import lru_cache
from typing import Any, Optional

import pyarrow as pa

from jobs.io import digests, sources
from jobs.io.digests import salt_id
from jobs.io.run_index import RunIndex
from jobs.io.run_store import ADMISSION_KEYS, RunStore
from jobs.io.storage import Location, file_info, read_bytes, write_bytes_atomic
from jobs.pipeline import admission, input_fingerprints, input_formats, seen_keys, validate
from jobs.pipeline.admission import Admission, Recorded

logger = logging.getLogger("raygen")
FORMAT = 2  # 1 was never released: keys without counts
NAME = ADMISSION_KEYS
MAX_REJECT_IDS = 200_000


@lru_cache(maxsize=1)
def _code_hash() -> str:
    h = hashlib.sha256()
    for module in (admission, seen_keys, input_fingerprints, validate, input_formats, sources,
                   digests):
        h.update(inspect.getsource(module).encode())
    return h.hexdigest()[:16]


def identity(inputs: list[Location], limit: Optional[int], max_line_bytes: int,
             salt: bytes) -> dict[str, Any]:
    files = []
    for loc in inputs:
        info = file_info(loc)
        files.append({"uri": loc.uri, "size": info.size, "mtime_ns": info.mtime_ns})
    return {"format": FORMAT, "files": files, "limit": limit, "max_line_bytes": max_line_bytes,
            "key_salt_id": salt_id(salt), "code": _code_hash()}


def save(store: RunStore, inputs: list[Location], limit: Optional[int], max_line_bytes: int,
         result: Admission) -> bool:
    """Record a pass's findings (True when written)."""
    if result.input_keys is None or result.reject_ids is None:
        return False
    if len(result.reject_ids) > MAX_REJECT_IDS:
        logger.info("admission not recorded for reuse: %d rejects", len(result.reject_ids))
        return False
    meta = dict(identity(inputs, limit, max_line_bytes, result.table.salt),  # its digests' salt
                fingerprints=result.fingerprints, rejects=result.rejects,
                edited=result.edited, edited_examples=result.edited_examples,
                reject_ids=result.reject_ids)
    digests, ordinals, counts = result.input_keys
    table = pa.table({"digest": pa.array(digests, pa.uint64()),
                      "ordinal": pa.array(ordinals, pa.int64()),
                      "count": pa.array(counts, pa.uint32())})
    table = table.replace_schema_metadata({"admission_record": json.dumps(meta)})
    sink = pa.BufferOutputStream()
    # zstd: the ordinals and counts compress, the digests do not (9M keys: 171 -> 93 MiB)
    with pa.ipc.new_file(sink, table.schema,
                         options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table)
    try:
        write_bytes_atomic(store.loc(*NAME), sink.getvalue().to_pybytes())
    except OSError as exc:  # costs the next session a whole pass, nothing else
        logger.warning("admission not recorded for reuse (%s)", exc)
        return False
    return True


def _reads(then: list[dict], now: list[dict], fingerprints: list[dict],
           limit: Optional[int]) -> Optional[list[str]]:
    """Per input file "same", "tail" or "new"; None when a whole pass must run."""
    if len(now) < len(then) or [f["uri"] for f in now[:len(then)]] != [
            f["uri"] for f in then]:
        return None
    reads = []
    for k, (old, cur) in enumerate(zip(then, now)):
        if (old["size"], old["mtime_ns"]) == (cur["size"], cur["mtime_ns"]):
            reads.append("same")
        elif (k == len(then) - 1 and limit is None and cur["size"] > old["size"]
              and fingerprints[k].get("ends_newline") and fingerprints[k].get("sha256")
              and not cur["uri"].endswith(".parquet")):
            reads.append("tail")
        else:
            return None
    if len(now) > len(then) and limit is not None:
        return None
    return reads + ["new"] * (len(now) - len(then))


def load(store: RunStore, inputs: list[Location], limit: Optional[int], max_line_bytes: int,
         index: RunIndex) -> Optional[Recorded]:
    """What the recorded pass lets this session skip, or None when a whole pass must run."""
    loc = store.loc(*NAME)
    data = read_bytes(loc)
    if data is None:
        return None
    try:
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
        meta = json.loads(table.schema.metadata[b"admission_record"])
    except (pa.ArrowInvalid, OSError, KeyError, TypeError, ValueError) as exc:
        logger.warning("%s is unreadable (%s): running the admission pass", loc.uri, exc)
        return None
    if meta.get("format") != FORMAT:
        logger.info("%s is of format %r: running the admission pass", loc.uri, meta.get("format"))
        return None
    now = identity(inputs, limit, max_line_bytes, store.key_salt)
    changed = [k for k in now if k != "files" and meta.get(k) != now[k]]
    reads = None if changed else _reads(meta["files"], now["files"], meta["fingerprints"],
                                        limit)
    if reads is None:
        logger.info("admission pass: %s changed since the recorded one",
                    ", ".join(changed) or "the input files")
        return None
    missing = set(meta["reject_ids"]) - index.reject_ids
    if missing:
        logger.info("admission pass: %d recorded rejects are not in rejects/ yet", len(missing))
        return None
    return Recorded(digests=table.column("digest").to_numpy(),
                    ordinals=table.column("ordinal").to_numpy(),
                    counts=table.column("count").to_numpy(), files=meta["fingerprints"],
                    reads=reads, reject_ids=meta["reject_ids"], rejects=meta["rejects"],
                    edited=meta["edited"], edited_examples=meta["edited_examples"])
