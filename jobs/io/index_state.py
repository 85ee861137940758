"""The run index's state as one value: what ``RunIndex`` derives from a run's sidecars.

A compact object (jobs/io/index_compact.py) is this value encoded; its open decodes it
back and hands it to ``RunIndex.apply``, which is the only code that sets an index's
fields. ``RunIndex.state()`` gives it to the writer. Nothing here reads storage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import numpy as np

# Per-key arrays, kept aligned and sorted by digest: 43 bytes a key.
COLUMNS = {"digest": np.uint64, "version": np.int32, "created_ms": np.int64,
           "part": np.uint32, "row": np.uint32, "finish": np.uint8, "tokens": np.int32,
           "prompt": np.uint64, "settings": np.uint16}


def empty_latest() -> dict[str, np.ndarray]:
    return {name: np.empty(0, dtype) for name, dtype in COLUMNS.items()}


class PartRecord(NamedTuple):
    """A part the state covers: its path, its size as listed, its sha256 ("" unknown)."""

    path: str
    size: int
    sha256: str


@dataclass
class IndexState:
    """What an index holds after reading ``parts``, as one value (arrays not copied)."""

    latest: dict[str, np.ndarray] = field(default_factory=empty_latest)  # as COLUMNS
    failed: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))  # sorted
    reject_ids: set[str] = field(default_factory=set)
    parts: list[PartRecord] = field(default_factory=list)   # every part read, every kind
    data_parts: list[str] = field(default_factory=list)     # paths: latest["part"] indexes it
    finishes: list[Optional[str]] = field(default_factory=list)   # finish code -> reason
    settings: list[Optional[str]] = field(default_factory=list)   # settings code -> hash
    first_budgets: dict[tuple, int] = field(default_factory=dict)  # (hash, budget) -> rows
    data_rows: int = 0                                       # data rows of every version

    @property
    def keys(self) -> int:
        return len(self.latest["digest"])
