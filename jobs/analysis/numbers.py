"""How the reports write a number: rounded, and None (JSON null) when it is missing or
not finite, so report.json never holds NaN or Infinity."""

from __future__ import annotations

import math
from typing import Any, Optional


def rounded(x: Any, nd: int = 4) -> Optional[float]:
    """``x`` rounded to ``nd`` decimals; None for None, pandas' NA, NaN and infinities."""
    if x is None:
        return None
    try:
        x = float(x)
    except TypeError:  # pandas.NA
        return None
    return round(x, nd) if math.isfinite(x) else None
