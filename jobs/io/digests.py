"""Keys as fixed-size digests: 8 bytes per key in numpy arrays instead of Python strings.

The first 8 bytes of blake2b(key), read as a little-endian uint64. Admission
(jobs/pipeline/admission.py) and the run index (jobs/io/run_index.py) use this one
function, so a key's digest in the admission table is the digest the run index holds.
Two different keys share a digest with probability ~n^2/2^65 (3e-6 at 10M keys).
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Optional

import numpy as np


def key_digest(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def digests_of(keys: Iterable[Optional[str]]) -> np.ndarray:
    """uint64 digests of keys (a None key gets digest 0, which no real key is checked for)."""
    return np.fromiter((key_digest(k) if k is not None else 0 for k in keys), np.uint64)


def sorted_contains(haystack: np.ndarray, needles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(found mask, position) of each needle in a sorted array."""
    if not len(haystack):
        return np.zeros(len(needles), bool), np.zeros(len(needles), np.int64)
    pos = np.minimum(np.searchsorted(haystack, needles), len(haystack) - 1)
    return haystack[pos] == needles, pos
