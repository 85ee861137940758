"""Adaptive rows in flight (``job.inflight: adaptive``, the default; issue 36 item 2).

Each generate actor's RowSender keeps ``limit`` rows in flight; this controller moves
``limit`` within [1, job.inflight_rows_per_actor] from what the engines report. Every
result carries its engine's load (serve_apps/engine_load.py: cap, rows in the engine,
running, queued, token usage, retraction counter); the controller keeps the latest per
replica and decides at most once per ``decide_s``, on a result's arrival, like TCP's
congestion window (additive increase, multiplicative decrease):

- **retraction**: an engine's retraction counter rose since the last decision ->
  ``limit x BACKOFF``, at most once per ``cooldown_s`` (one burst is one signal). The
  engine admitted past its KV pool: fewer rows in flight mean fewer queued rows for its
  optimistic admission to take in.
- **full**: an engine's token usage is at or above ``HIGH_WATER`` while its queue holds
  ``queue_target`` rows or more -> ``limit - 1``: those rows would be admitted on
  SGLang's decaying new-token estimate into a near-full pool, which is how a retraction
  starts. A shorter queue is kept: it is what replaces a finished request at once
  (cutting at one queued row held the simulator's engines at 4 rows where 6 fit).
- **room**: no engine at ``HIGH_WATER`` and the engines queue fewer than
  ``queue_target`` rows on average (enough that a finished request is replaced at once,
  while the next rows are on their way) -> grow: doubled until the first decrease or
  until a pool is ``CAREFUL`` full (slow start: running rows grow into the pool, so its
  usage lags what they will need), then a row per engine per ``grow_s``; once an engine
  has retracted, from the limit that retraction cut to (``BACKOFF`` x the limit it
  happened at) only ``+1`` per ``PROBE_S``: rows vary in length, so what fits moves,
  and an engine a row past it retracts at a rate no quicker regrowth would stay under
  1% of rows (measured on the simulator: growing back at a row per engine per second
  retracted 8.8% of rows).
- otherwise hold.

Every actor runs its own controller on the same engines' reports, so after a
retraction they back off together and grow back at one row per actor per ``grow_s``.
What the controller cannot do is choose the engine: Serve routes each call (power of
two choices by ongoing calls); the sender keeps calls small while the limit is small
(RowSender) so that a call's rows do not hide an engine's load from that routing.
Pure and clock-injected: tests/unit/jobs/pipeline/test_inflight.py drives it in
virtual time.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

HIGH_WATER = 0.90   # token usage above which queued rows are not wanted
CAREFUL = 0.5       # token usage from which growth is additive (slow start ends): the
                    # rows already running grow into the pool, so usage lags what they need
BACKOFF = 0.8       # limit kept on a retraction
START = 4           # the first limit: doubled every DECIDE_S while there is room
DECIDE_S = 0.5      # at most one decision per this
GROW_S = 1.0        # after slow start: +1 row per engine per this
PROBE_S = 10.0      # ... and per this from where the last retraction cut to
COOLDOWN_S = 3.0    # one decrease per retraction burst
FORGET_S = 60.0     # a replica not heard from for this long is gone (replaced)


def queue_target(running: float) -> float:
    """Rows an engine should have waiting: 2, or a tenth of its batch when larger (a
    48-row batch finishes rows faster than a call brings the next ones)."""
    return max(2.0, 0.1 * running)


class InflightControl:
    """The rows one sender keeps in flight (see the module docstring)."""

    def __init__(self, lo: int, hi: int, start: Optional[int] = None,
                 clock: Callable[[], float] = time.monotonic, decide_s: float = DECIDE_S,
                 grow_s: float = GROW_S, cooldown_s: float = COOLDOWN_S) -> None:
        if not 1 <= lo <= hi:
            raise ValueError(f"in-flight bounds must satisfy 1 <= lo <= hi, got [{lo}, {hi}]")
        self.lo, self.hi, self._clock = lo, hi, clock
        self.decide_s, self.grow_s, self.cooldown_s = decide_s, grow_s, cooldown_s
        self.limit = max(lo, min(hi, start if start is not None else START))
        self.slow_start = True
        self.ceiling: Optional[int] = None  # the limit when an engine last retracted
        self.engines: dict[str, tuple[float, dict[str, Any]]] = {}  # replica -> (seen, load)
        self._retracted: dict[str, float] = {}  # replica -> its counter at the last decision
        self._decided_at = self._grown_at = self._cut_at = float("-inf")
        self.decisions: dict[str, int] = {"retraction": 0, "full": 0, "grow": 0}

    def observe(self, load: Optional[dict[str, Any]]) -> int:
        """Take one result's load report; returns the limit (changed at most once per
        ``decide_s``)."""
        now = self._clock()
        if load and load.get("replica"):
            self.engines[load["replica"]] = (now, load)
        if now - self._decided_at >= self.decide_s and self.engines:
            self._decided_at = now
            self._decide(now)
        return self.limit

    def _decide(self, now: float) -> None:
        for replica in [r for r, (seen, _) in self.engines.items() if now - seen > FORGET_S]:
            del self.engines[replica]
            self._retracted.pop(replica, None)
        loads = [load for _, load in self.engines.values()]
        retracted = False
        for load in loads:
            before = self._retracted.get(load["replica"])
            self._retracted[load["replica"]] = load["retracted"]
            retracted |= before is not None and load["retracted"] > before
        if retracted:
            if now - self._cut_at >= self.cooldown_s:
                self.ceiling = self.limit
                self._cut(now, max(self.lo, int(self.limit * BACKOFF)), "retraction")
            return
        if any(load["token_usage"] >= HIGH_WATER
               and load["queued"] >= queue_target(load["running"]) for load in loads):
            self._cut(now, max(self.lo, self.limit - 1), "full")
            return
        hot = any(load["token_usage"] >= HIGH_WATER for load in loads)
        waiting = sum(load["queued"] for load in loads) / len(loads)
        target = sum(queue_target(load["running"]) for load in loads) / len(loads)
        if hot or waiting >= target or self.limit >= self.hi:
            return
        if self.slow_start and any(load["token_usage"] >= CAREFUL for load in loads):
            self.slow_start = False
        near = self.ceiling is not None and self.limit >= int(self.ceiling * BACKOFF)
        if self.slow_start:
            self.limit = min(self.hi, self.limit * 2)
        elif now - self._grown_at >= (PROBE_S if near else self.grow_s):
            self.limit = min(self.hi, self.limit + (1 if near else len(loads)))
        else:
            return
        self._grown_at = now
        self.decisions["grow"] += 1

    def _cut(self, now: float, limit: int, why: str) -> None:
        self.limit, self.slow_start, self._cut_at = limit, False, now
        self._grown_at = now  # growth resumes a full grow_s later
        self.decisions[why] += 1
