"""The admission pass's set of the keys met so far, each with its first occurrence and
how often it occurred (a later occurrence is a duplicate: its rank names its reject)."""

from __future__ import annotations

import numpy as np

from jobs.io.digests import sorted_contains


class SeenKeys:
    """First occurrence of every valid key so far: digest, ordinal, occurrence count.

    Kept as a few sorted runs whose sizes at least double from newest to oldest (merged
    like a binary counter), so adding n keys in chunks costs O(n log n) in total, not
    the O(n^2) of inserting every chunk into one sorted array (157 s at 10M keys)."""

    def __init__(self) -> None:
        self.runs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    @property
    def nbytes(self) -> int:
        return int(sum(d.nbytes + o.nbytes + c.nbytes for d, o, c in self.runs))

    def contains(self, digests: np.ndarray) -> np.ndarray:
        found = np.zeros(len(digests), bool)
        for run, _, _ in self.runs:
            found |= sorted_contains(run, digests)[0]
        return found

    def add_new(self, digests: np.ndarray, ordinals: np.ndarray) -> None:
        """Add keys not seen before (unique, any order)."""
        run = _sorted_run(digests, ordinals, np.ones(len(digests), np.uint32))
        while self.runs and len(self.runs[-1][0]) <= 2 * len(run[0]):
            older = self.runs.pop()
            run = _sorted_run(*(np.concatenate([a, b]) for a, b in zip(older, run)))
        self.runs.append(run)

    def bump(self, digest: int) -> tuple[int, int]:
        """Count one more occurrence of a seen key: (its rank, first ordinal)."""
        needle = np.array([digest], np.uint64)
        for run, ordinals, counts in self.runs:
            found, pos = sorted_contains(run, needle)
            if found[0]:
                counts[pos[0]] += 1
                return int(counts[pos[0]]), int(ordinals[pos[0]])
        raise KeyError(digest)

    def merged(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sorted digests, their first ordinals, occurrence counts) of every key seen."""
        if not self.runs:
            return np.empty(0, np.uint64), np.empty(0, np.int64), np.empty(0, np.uint32)
        return _sorted_run(*(np.concatenate(cols) for cols in zip(*self.runs)))

    def add_counted(self, digests: np.ndarray, ordinals: np.ndarray,
                    counts: np.ndarray) -> None:
        """Add keys not seen before with their occurrence counts so far (a recorded pass)."""
        if len(digests):
            self.runs.insert(0, _sorted_run(digests, ordinals, counts.astype(np.uint32)))


def _sorted_run(digests: np.ndarray, ordinals: np.ndarray,
                counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    order = np.argsort(digests, kind="stable")  # radix sort for uint64: O(n)
    return digests[order], ordinals[order], counts[order]
