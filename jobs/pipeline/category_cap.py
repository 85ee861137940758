"""The bound on the ``category`` metric label the generate actors apply before a row's
category reaches a replica's metrics (serve_apps/replica_metrics.py)."""

from __future__ import annotations

from typing import Optional

OTHER_CATEGORY = "other"


class CategoryCap:
    """Bound the ``category`` label: the first ``limit`` distinct categories this actor
    sees keep their name, every later one is reported as ``other``.

    Categories come from user data, so without a cap one typo-ridden input could create
    thousands of series per replica. Input order puts the common categories first in
    practice; each generate actor decides on its own, so with N actors at most
    N x limit names exist (usually the same few).
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.kept: set[str] = set()

    def __call__(self, category: Optional[str]) -> str:
        name = category or ""
        if name in self.kept:
            return name
        if len(self.kept) < self.limit:
            self.kept.add(name)
            return name
        return OTHER_CATEGORY
