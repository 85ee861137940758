"""What drained replicas condemned, recorded under the run (one file per replica):

    <run>/condemned/<replica>.json   {"format": 1, "replica", "reason", "drained_at",
                                      "keys": [the run's condemned keys, sorted]}

A drained replica (serve_apps/output_watch.py) puts the record on every result it
returns from its drain on (``GenerateResult.drained``); the generate actor that gets one
writes it before that row is written, the same bytes whichever actor writes it. The keys
are those of the replica's window and of the rows it still held; which of them are still
to regenerate is decided against data/ (jobs/runs/regenerate.py). A later raygen that
changes the record writes another format; this one refuses what it cannot read.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from jobs.io.run_store import CONDEMNED, RunStore
from jobs.io.storage import list_files, read_json, write_json_atomic

FOLDER = CONDEMNED
FORMAT = 1
READABLE_FORMATS = (1,)


class UnknownRecord(ValueError):
    """A record of a format this raygen cannot read."""


def record_name(replica: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", replica or "unknown") + ".json"


def write_record(store: RunStore, drained: dict[str, Any]) -> None:
    """A drained replica's record (GenerateResult.drained) under the run."""
    record = {"format": FORMAT, "replica": drained["replica"], "reason": drained["reason"],
              "drained_at": drained["drained_at"], "keys": sorted(drained["keys"])}
    write_json_atomic(store.loc(FOLDER, record_name(drained["replica"])), record)


def read_records(store: RunStore) -> list[dict[str, Any]]:
    """Every record of the run; UnknownRecord names one of another format."""
    records = []
    for info in list_files(store.loc(FOLDER), ".json"):
        name = posixpath.basename(info.path)
        record = read_json(store.loc(FOLDER, name))
        if not isinstance(record, dict) or record.get("format") not in READABLE_FORMATS:
            raise UnknownRecord(
                f"{store.uri}/{FOLDER}/{name} is not a condemned-rows record of format "
                f"{', '.join(map(str, READABLE_FORMATS))}: a newer raygen wrote it, or it was "
                f"edited; use that raygen, or move the file away to keep those rows as they are")
        records.append(record)
    return records
