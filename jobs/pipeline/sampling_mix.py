"""Sampling mixes (``job.sampling`` as a list): which setting each row gets.

- A :class:`Setting` is one entry as the generate stage sends it: its name, weight and
  SGLang params (+ raygen's ``thinking`` when false: jobs/config.py). A run of one
  setting has one, named None: its rows' ``setting`` column stays null and its
  settings hash is what it always was (``hashed``).
- The draw: blake2b(key NUL sample), keyed by the run's salt with its own person
  string, 64 bits read as u in [0, 1); the row gets the first setting whose cumulative
  share of the weights passes u. So a row's setting is a function of its identity
  (key, sample) and the run: every session draws the same (a resume, --retry-failed);
  samples of one prompt draw independently; another run (another salt) draws anew.
  The admit stage draws (``with_settings``) and the row records it; continue,
  regenerate and next-turn sessions send a data/ row with the setting it recorded.
- ``hashed``: what settings_hash covers, the mix as a whole (names, weights, params and
  the draw's scheme): any change to it is another run's settings, refused on resume.
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Optional, Sequence

import pyarrow as pa

from jobs.config import JobConfig

DRAW_SCHEME = 1                 # in settings_hash with a mix: how settings are drawn
_PERSON = b"raygen-mix"          # not the seed's (jobs/io/samples.py): independent draws
SETTING_COLUMN = "setting"


@dataclass(frozen=True)
class Setting:
    """One sampling setting of the run, as sent and recorded."""

    name: Optional[str]          # None: the run's only setting (job.sampling a mapping)
    weight: float
    sampling: dict[str, Any]     # SGLang params (+ thinking: false), as sent and hashed
    sampling_json: str           # as stored in the row's sampling column

    @property
    def thinking(self) -> bool:
        return self.sampling.get("thinking", True)

    @property
    def max_thinking_tokens(self) -> Optional[int]:
        return self.sampling.get("max_thinking_tokens")


def settings_of(job: JobConfig) -> tuple[Setting, ...]:
    """The run's settings: one unnamed, or the mix's in config order."""
    out = []
    for entry in job.settings:
        sampling = entry.to_sglang()
        out.append(Setting(getattr(entry, "name", None), getattr(entry, "weight", 1.0),
                           sampling, json.dumps(sampling, sort_keys=True)))
    return tuple(out)


def hashed(settings: Sequence[Setting]) -> dict[str, Any]:
    """The sampling part of settings_hash: the one setting's params as always, or the
    whole mix."""
    if len(settings) == 1 and settings[0].name is None:
        return settings[0].sampling
    return {"mix": [[s.name, s.weight, s.sampling] for s in settings], "draw": DRAW_SCHEME}


def draw_unit(salt: bytes, key: str, sample: Optional[int]) -> float:
    """The row's u in [0, 1): a function of (key, sample) and the run's salt."""
    digest = hashlib.blake2b(f"{key}\x00{sample or 0}".encode(), digest_size=8, salt=salt,
                             person=_PERSON).digest()
    return int.from_bytes(digest, "little") / 2.0 ** 64


def draw(weights: Sequence[float], salt: bytes, key: str, sample: Optional[int]) -> int:
    """The index of the setting (key, sample) gets under these weights."""
    bounds = list(accumulate(weights))
    at = bisect_right(bounds, draw_unit(salt, key, sample) * bounds[-1])
    return min(at, len(weights) - 1)


def with_settings(batch: pa.Table, mix: Sequence[tuple[str, float]], salt: bytes) -> pa.Table:
    """The admit stage's rows with their drawn ``setting`` name ((name, weight) per
    setting of the mix; the rows' ``sample`` column when they have one)."""
    names, weights = [m[0] for m in mix], [m[1] for m in mix]
    keys = batch.column("key").to_pylist()
    samples = (batch.column("sample").to_pylist() if "sample" in batch.column_names
               else [None] * len(keys))
    drawn = [names[draw(weights, salt, k, s)] for k, s in zip(keys, samples)]
    return batch.append_column(SETTING_COLUMN, pa.array(drawn, pa.string()))
