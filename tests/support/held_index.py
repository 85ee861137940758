"""A run index of no store that holds given keys: what admission and the plans see of a
run, built through the index's own state (``RunIndex.apply``), for tests."""

from __future__ import annotations

from typing import Iterable, Optional

import numpy as np

from jobs.io.digests import digests_of
from jobs.io.index_state import COLUMNS, IndexState
from jobs.io.run_index import RunIndex


def holding(done: dict[str, Optional[str]], failed: Iterable[str] = (),
            reject_ids: Iterable[str] = ()) -> RunIndex:
    """An index holding these keys (key -> prompt_hash, None when the row predates
    prompt hashes), failed keys and reject ids; unsalted digests, as a run without
    run.json. Its other per-key columns are zeros."""
    digests, first = np.unique(digests_of(done), return_index=True)
    latest = {name: np.zeros(len(digests), dtype) for name, dtype in COLUMNS.items()}
    latest["digest"] = digests
    latest["prompt"] = digests_of(list(done.values()))[first]
    index = RunIndex(None)  # type: ignore[arg-type] - never refreshed
    index.apply(IndexState(latest=latest, failed=np.unique(digests_of(failed)),
                           reject_ids=set(reject_ids)))
    return index
