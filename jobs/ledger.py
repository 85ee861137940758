"""Which input rows still need work (stage 3 of the job): the resume logic.

The driver reads the run's own files (data/, failures/, rejects/) and hands the keys
to one small actor; every block of validated rows asks it which rows go on. Nothing
but the durable output decides: no side "done index" that can disagree with it.

Per row: already in data/ -> skip; in failures/ -> skip, unless ``--retry-failed``
(then only those go); rejected earlier (same file and line) -> skip; an id seen before
in this pass -> a ``duplicate id`` reject naming the first line.
"""

from __future__ import annotations

from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc
import ray

GO, SKIP = "go", "skip"


@ray.remote(num_cpus=0)
class KeyLedger:
    def __init__(self, done: set[str], failed: set[str], rejected_lines: set[str],
                 retry_failed: bool):
        self.done, self.failed, self.rejected = done, failed - done, rejected_lines
        self.retry_failed = retry_failed
        self.first_seen: dict[str, str] = {}

    def admit(self, keys: list[Optional[str]], where: list[str],
              invalid: list[bool]) -> list[str]:
        """GO, SKIP, or a duplicate reason for each row."""
        out = []
        for key, place, bad in zip(keys, where, invalid):
            if place in self.rejected:
                out.append(SKIP)
            elif bad:
                out.append(GO)  # flows on to rejects/ with its validation reason
            elif key in self.first_seen:
                out.append(f"duplicate id {key!r}: first seen at {self.first_seen[key]}")
            else:
                self.first_seen[key] = place
                out.append(self._decide(key))
        return out

    def _decide(self, key: str) -> str:
        if key in self.done:
            return SKIP
        if self.retry_failed:
            return GO if key in self.failed else SKIP
        return SKIP if key in self.failed else GO

    def counts(self) -> dict[str, int]:
        return {"done": len(self.done), "failed_open": len(self.failed),
                "rejected": len(self.rejected), "seen": len(self.first_seen)}


def place_of(source: str, line: int) -> str:
    return f"{source}:{line}"


def admit_batch(batch: pa.Table, ledger) -> pa.Table:
    """map_batches function: drop rows that need no work, mark duplicates as rejects."""
    keys = batch.column("key").to_pylist()
    places = [place_of(s, n) for s, n in zip(batch.column("source").to_pylist(),
                                             batch.column("line").to_pylist())]
    invalid = batch.column("reject_reason").is_valid().to_pylist()
    verdicts = ray.get(ledger.admit.remote(keys, places, invalid))
    reasons = batch.column("reject_reason").to_pylist()
    reasons = [v if v not in (GO, SKIP) else r for v, r in zip(verdicts, reasons)]
    batch = batch.set_column(batch.schema.get_field_index("reject_reason"),
                             "reject_reason", pa.array(reasons, pa.string()))
    return batch.filter(pc.not_equal(pa.array(verdicts, pa.string()), SKIP))
