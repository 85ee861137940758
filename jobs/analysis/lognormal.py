"""The lognormal pieces the what-if and the trainable-token what-if share: the normal
tail in log space and the partial moments of a lognormal below a bound. A module of
their own so forecast.py and token_yield.py both import them and not each other."""

from __future__ import annotations

import numpy as np
from scipy.special import log_ndtr


def log_q(z: np.ndarray) -> np.ndarray:
    """log P(Z > z) for a standard normal (scipy's log_ndtr: tails never underflow)."""
    return log_ndtr(-np.asarray(z, dtype=float))


def parts_below(mu, sigma, m):
    """E[L; L <= m] and P(L <= m) for L ~ lognormal(mu, sigma), m > 0 (broadcast)."""
    z = (np.log(m) - mu) / sigma
    return np.exp(mu + 0.5 * sigma ** 2 + log_q(sigma - z)), 1.0 - np.exp(log_q(z))
