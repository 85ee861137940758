"""What the admission pass records of each input file, and what changed since.

    <run>/inputs.json   {"files": [{"uri", "size", "rows", "sha256", "newlines",
                                    "ends_newline"}, ...]}  one per job.input file

``Fingerprint`` hashes a file's bytes as the pass reads them (sha256 None when job.limit
stopped it early). The session records the pass's fingerprints after it (``record``,
jobs/runs/plans.py); the next session says what changed in its inputs (``changes``: a
file renamed or moved, a file changed), counts its rows from them while a file keeps
its size (plans.input_total), and provenance.json names them (jobs/runs/provenance.py).
The admission cache (jobs/pipeline/admission_cache.py) keeps its own copy beside its keys.
"""

from __future__ import annotations

import hashlib
from typing import Any, Optional

from jobs.io.run_store import INPUTS_FILE, RunStore
from jobs.io.storage import write_json_atomic


class Fingerprint:
    """sha256 of a file's bytes as the pass reads them, with its newline count and last
    byte; with ``at``, also the sha256 of its first ``at`` bytes (a grown file's old
    content, to check against the recorded sha256)."""

    def __init__(self, at: Optional[int] = None):
        self.sha, self.at, self.prefix = hashlib.sha256(), at, None
        self.read, self.newlines, self.last = 0, 0, b""

    def update(self, chunk: bytes) -> None:
        if self.at is not None and self.prefix is None and self.read + len(chunk) >= self.at:
            cut = self.at - self.read
            self.sha.update(chunk[:cut])
            self.prefix = self.sha.hexdigest()
            self.sha.update(chunk[cut:])
        else:
            self.sha.update(chunk)
        self.read += len(chunk)
        self.newlines += chunk.count(b"\n")
        if chunk:
            self.last = chunk[-1:]

    def hexdigest(self) -> str:
        return self.sha.hexdigest()


def file_record(uri: str, size: Optional[int], rows: int, hasher: Fingerprint,
                complete: bool) -> dict[str, Any]:
    """One file's entry in inputs.json (sha256 None: the pass stopped inside it)."""
    return {"uri": uri, "size": size, "rows": rows,
            "sha256": hasher.hexdigest() if complete else None,
            "newlines": hasher.newlines, "ends_newline": hasher.last == b"\n"}


def recorded(store: RunStore) -> Optional[list[dict[str, Any]]]:
    """The files inputs.json recorded (None: no session recorded any yet)."""
    return (store.read_json(INPUTS_FILE) or {}).get("files")


def record(store: RunStore, prints: list[dict[str, Any]]) -> None:
    write_json_atomic(store.loc(INPUTS_FILE), {"files": prints})


def changes(prints: list[dict[str, Any]], previous: Optional[list[dict[str, Any]]]
            ) -> list[str]:
    """What changed in the input files since ``previous`` was recorded, one line each."""
    lines = []
    old = {p["uri"]: p for p in previous or []}
    by_hash = {p["sha256"]: p["uri"] for p in previous or [] if p.get("sha256")}
    for p in prints:
        before = old.get(p["uri"])
        if before is None and p["sha256"] in by_hash:
            lines.append(f"input {p['uri']} has the content of {by_hash[p['sha256']]} "
                         f"(renamed or moved): rows keep their keys, nothing is redone")
        elif before is not None and p["sha256"] and before.get("sha256") not in (
                None, p["sha256"]):
            lines.append(f"input {p['uri']} changed since the last session: "
                         f"{before['rows']} -> {p['rows']} rows")
    return lines
