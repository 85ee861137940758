"""Tiny PromQL string builders.

Only string composition -- no validation beyond what keeps the output readable.
Every builder returns an expression that is safe to embed as an operand (i.e.
wrapped in parentheses when it contains a binary operator), so callers can nest
them without thinking about operator precedence.
"""

from __future__ import annotations

from typing import Iterable, Sequence

# Label matchers for the dashboard's template variables.
RUN_MODEL = ('run=~"$run"', 'model=~"$model"')
MODEL = ('model=~"$model"',)


def sel(metric: str, *matchers: str, **equals: str) -> str:
    """``metric{m1,m2,k="v"}``; matchers are raw strings, kwargs become ``k="v"``."""
    parts = list(matchers) + [f'{k}="{v}"' for k, v in equals.items()]
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric


def _by(labels: Sequence[str]) -> str:
    return f" by ({', '.join(labels)})" if labels else ""


def rate(selector: str, window: str) -> str:
    return f"rate({selector}[{window}])"


def increase(selector: str, window: str) -> str:
    return f"increase({selector}[{window}])"


def agg(op: str, labels: Sequence[str], expr: str) -> str:
    """``op by (labels) (expr)``; ``labels=()`` aggregates everything away."""
    return f"{op}{_by(labels)} ({expr})"


def sum_by(labels: Sequence[str], expr: str) -> str:
    return agg("sum", labels, expr)


def max_by(labels: Sequence[str], expr: str) -> str:
    return agg("max", labels, expr)


def min_by(labels: Sequence[str], expr: str) -> str:
    return agg("min", labels, expr)


def avg_by(labels: Sequence[str], expr: str) -> str:
    return agg("avg", labels, expr)


def count_by(labels: Sequence[str], expr: str) -> str:
    return agg("count", labels, expr)


def sum_rate(metric: str, window: str, by: Sequence[str] = (), matchers: Iterable[str] = (), **equals: str) -> str:
    """The workhorse: ``sum by (by) (rate(metric{...}[window]))``."""
    return sum_by(by, rate(sel(metric, *matchers, **equals), window))


def safe_ratio(num: str, den: str) -> str:
    """num/den where 0/0 yields 0 instead of NaN (use when 'nothing happened' = 0)."""
    return f"({num} / clamp_min({den}, 1e-9))"


def ratio_if_positive(num: str, den: str) -> str:
    """num/den, no sample at all when den == 0 (use when 0/0 means 'not measurable')."""
    return f"({num} / ({den} > 0))"


def ratio_if_at_least(num: str, den: str, minimum: str) -> str:
    """num/den, no sample where den < ``minimum`` (too little traffic to judge)."""
    return f"({num} / ({den} >= {minimum}))"


def rest_of(group: Sequence[str], expr: str) -> str:
    """Per series of ``expr``: the sum over its ``group`` minus its own value (the rest
    of its fleet). ``expr`` must already be aggregated to ``group`` + one member label.
    ``group_right()`` with its empty list: a bare ``group_right`` followed by ``(`` (an
    inlined recording rule) would read the parenthesis as its label list."""
    on = ", ".join(group)
    return f"({sum_by(group, expr)} - on ({on}) group_right() {expr})"


def or_zero(expr: str, like: str) -> str:
    """``expr``, with 0 for every label set present in ``like`` but missing in ``expr``.

    Counter series such as completions{finish_reason="length"} only exist after
    the first event; without this a run with zero truncations shows "No data".
    Both sides must already be aggregated to the same label set.
    """
    return f"({expr} or (0 * {like}))"


def histogram_quantile(q: float, metric: str, window: str, by: Sequence[str] = (),
                       matchers: Iterable[str] = ()) -> str:
    """Quantile of a Ray histogram (``metric`` is the exported base, without _bucket)."""
    buckets = sum_by(("le", *by), rate(sel(metric + "_bucket", *matchers), window))
    return f"histogram_quantile({q}, {buckets})"


def and_on(labels: Sequence[str], lhs: str, rhs: str) -> str:
    return f"({lhs} and on ({', '.join(labels)}) {rhs})"


def unless_on(labels: Sequence[str], lhs: str, rhs: str) -> str:
    return f"({lhs} unless on ({', '.join(labels)}) {rhs})"


_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(window: str) -> int:
    """A single-unit Prometheus duration (``"15m"``) in seconds."""
    number, unit = window[:-1], window[-1:]
    if unit not in _UNIT_SECONDS or not number.isdigit():
        raise ValueError(f"not a single-unit duration: {window!r}")
    return int(number) * _UNIT_SECONDS[unit]


def per_window(count: float, window: str) -> str:
    """``count`` events per ``window`` as a per-second rate, written so a reader sees both."""
    return f"({count:g} / {seconds(window)})"


def compare(expr: str, op: str, threshold: float) -> str:
    return f"{expr} {op} {threshold:g}"
