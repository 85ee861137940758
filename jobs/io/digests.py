"""Keys as fixed-size digests: 8 bytes per key in numpy arrays instead of Python strings.

The first 8 bytes of blake2b(key) with the run's salt, read as a little-endian uint64.
Admission (jobs/pipeline/admission.py), the sidecars (jobs/io/part_summary.py) and the
run index (jobs/io/run_index.py) use these functions with the run's salt
(``RunStore.key_salt``, from ``<run>/run.json``), so a key's digest in the admission table
is the digest the run index holds.

Why a salt: two different keys share an unsalted 8-byte digest after ~2^32 hashes of
crafted keys, and the later one is rejected as a duplicate of the other. With 16 random
bytes chosen when the run is created, a colliding pair cannot be prepared before the run
exists. It goes in blake2b's salt parameter (its parameter block), so it costs nothing
per key and keeps 8 bytes per key (43 B per key in the run index: 430 MB at 10M keys;
16-byte digests would add 80 MB there and as much in the admission pass). Runs created
before salts (no run.json, or run.json without a salt) keep the unsalted digests their
sidecars hold. By chance alone two keys collide with probability ~n^2/2^65 (3e-6 at 10M).
"""

from __future__ import annotations

import hashlib
import os
from typing import Iterable, Optional

import numpy as np

SALT_BYTES = 16   # blake2b's salt parameter holds at most 16 bytes


def new_salt() -> bytes:
    return os.urandom(SALT_BYTES)


def salt_id(salt: bytes) -> str:
    """What a sidecar records of the salt its digests used ("" for none): a sidecar of
    another salt is rebuilt, never trusted."""
    return hashlib.sha256(salt).hexdigest()[:16] if salt else ""


def key_digest(key: str, salt: bytes = b"") -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8, salt=salt).digest(),
                          "little")


_NONE = bytes(8)


def digests_of(keys: Iterable[Optional[str]], salt: bytes = b"") -> np.ndarray:
    """uint64 digests of keys (a None key gets digest 0, which no real key is checked for).
    The digests' bytes are joined and read as little-endian uint64 at once: a third faster
    than an int per key (bench/key_digests.py)."""
    blake2b = hashlib.blake2b
    joined = b"".join(blake2b(k.encode(), digest_size=8, salt=salt).digest()
                      if k is not None else _NONE for k in keys)
    return np.frombuffer(joined, "<u8").astype(np.uint64)


def sorted_contains(haystack: np.ndarray, needles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(found mask, position) of each needle in a sorted array."""
    if not len(haystack):
        return np.zeros(len(needles), bool), np.zeros(len(needles), np.int64)
    pos = np.minimum(np.searchsorted(haystack, needles), len(haystack) - 1)
    return haystack[pos] == needles, pos
