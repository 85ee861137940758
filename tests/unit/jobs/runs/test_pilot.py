"""jobs.runs.pilot: the stratified sample a pilot run is made of."""

from __future__ import annotations

import pandas as pd

from jobs.runs.pilot import pilot_sample


def test_pilot_sample_is_stratified_and_reproducible():
    df = pd.DataFrame({"category": ["a"] * 900 + ["b"] * 95 + ["c"] * 3 + [None] * 2,
                       "x": range(1000)})
    pick = pilot_sample(df, 100, seed=7)
    counts = pick["category"].fillna("none").value_counts().to_dict()
    assert counts == {"a": 86, "b": 9, "c": 3, "none": 2}   # floors, then proportional
    assert pick.index.is_monotonic_increasing                   # input order kept
    assert pick.equals(pilot_sample(df, 100, seed=7))
    assert not pick.equals(pilot_sample(df, 100, seed=8))
    assert len(pilot_sample(df, 5000)) == 1000
