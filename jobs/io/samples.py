"""n samples per prompt (``job.samples_per_prompt``): a row's identity is (key, sample).

With n > 1 every admitted prompt becomes n rows, samples 0..n-1, each its own identity
in the run: its own digest in the sidecars and the run index (so done, failed, latest
version, continuation and quarantine are per sample), its own part row ids and its own
seed. With n = 1 (the default) nothing here applies: rows carry no sample (null) and no
seed, their identity is the key, and every digest, name and hash is what it always was.

- Identity digest: sample 0 (and a null sample: rows of n = 1, parts written before the
  column) is the key's digest itself; sample s >= 1 is a 64-bit mix (splitmix64's
  finaliser, a bijection) of the key's salted digest and s. So raising n keeps the rows
  already made as samples 0..n-1, and the mix works on digests alone: the admission pass
  expands the input's keys into identities without their strings.
- Row ids (part names, jobs/io/run_store.py): a sample >= 1 adds ``\\x00<s>`` to the key,
  a character no key can hold (validate.py refuses NUL), so ids never collide.
- Seed: blake2b(key NUL sample), keyed by the run's salt with its own person string,
  63 bits: stable across sessions of the run (a resume or a continuation sends a sample
  the same seed), distinct between samples and between runs. Sent as SGLang's
  ``sampling_params.sampling_seed`` and recorded in the row's ``seed`` column.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Optional

import numpy as np

from jobs.io.digests import digests_of

SEED_FIELD = "sampling_seed"   # SGLang 0.5.23 SamplingParams: an int in [-2**63, 2**63)
SEED_SCHEME = 1                # in settings_hash when n > 1: how seeds are derived
_SEED_PERSON = b"raygen-seed"
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def sample_digests(digests: np.ndarray, samples) -> np.ndarray:
    """Identity digests of (key, sample) from the keys' digests; ``samples``: an int or an
    array aligned with ``digests`` (sample 0 keeps the key's digest)."""
    d = np.asarray(digests, np.uint64)
    s = np.broadcast_to(np.asarray(samples, np.int64), d.shape).astype(np.uint64)
    with np.errstate(over="ignore"):
        x = d ^ (s * _GOLDEN)
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        x = x ^ (x >> np.uint64(31))
    return np.where(s == 0, d, x)


def identity_digests(keys: Iterable[Optional[str]], samples: Optional[Iterable[Optional[int]]],
                     salt: bytes = b"") -> np.ndarray:
    """Digests of rows' identities: their keys' with their samples mixed in (``samples``
    None, or a null sample: the key's own digest)."""
    digests = digests_of(keys, salt)
    if samples is None:
        return digests
    s = np.fromiter((v or 0 for v in samples), np.int64, len(digests))
    return sample_digests(digests, s) if s.any() else digests


def row_key(key: str, sample: Optional[int]) -> str:
    """The identity as text (part row ids): the key, or key NUL sample for sample >= 1."""
    return key if not sample else f"{key}\x00{sample}"


def sample_seed(salt: bytes, key: str, sample: int) -> int:
    """The seed of (key, sample) in a run whose key salt is ``salt``: in [0, 2**63)."""
    digest = hashlib.blake2b(f"{key}\x00{sample}".encode(), digest_size=8, salt=salt,
                             person=_SEED_PERSON).digest()
    return int.from_bytes(digest, "little") >> 1
