"""One rule for a number in a report: rounded, or None when it is not one."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from jobs.analysis.numbers import rounded


def test_missing_and_non_finite_numbers_are_none_and_the_rest_rounded():
    for missing in (None, pd.NA, math.nan, np.nan, math.inf, -np.inf, np.float32("nan")):
        assert rounded(missing) is None, missing
    assert rounded(np.float64(2.123456)) == 2.1235 and rounded(3, 1) == 3.0
    assert isinstance(rounded(np.int64(7)), float)
