"""The admission table: the rows a session generates, as the driver's admission pass
(jobs/pipeline/admission.py) chose them and the admit stage (jobs/pipeline/admit_stage.py)
keeps them.

Sorted 8-byte key digests (identity digests of (key, sample) with
job.samples_per_prompt > 1, jobs/io/samples.py) and the ordinal of each key's chosen
row: 16 bytes per admitted key, put in the object store once. The digests carry the
run's salt (jobs/io/digests.py), which the table takes to the admit stage's workers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jobs.io.digests import sorted_contains


@dataclass
class AdmissionTable:
    """The rows to generate: sorted key digests (identity digests of (key, sample) when
    ``samples`` > 1) and the ordinal of each key's chosen row."""

    digests: np.ndarray   # uint64, sorted, unique
    ordinals: np.ndarray  # int64, aligned with digests
    salt: bytes = b""     # of the digests: the run's (jobs/io/digests.py)
    samples: int = 1      # job.samples_per_prompt: the admit stage expands rows into these

    @property
    def nbytes(self) -> int:
        return int(self.digests.nbytes + self.ordinals.nbytes)

    def __len__(self) -> int:
        return len(self.digests)

    def admits(self, digests: np.ndarray, ordinals: np.ndarray) -> np.ndarray:
        if not len(self.digests):  # a resume with nothing left to do
            return np.zeros(len(digests), bool)
        found, pos = sorted_contains(self.digests, digests)
        return found & (self.ordinals[pos] == ordinals)
