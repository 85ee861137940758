"""The engine's load, sent back with every result: what the job's adaptive in-flight
control steers by (jobs/pipeline/inflight.py, issue 36 item 2).

A result carries ``load``: the replica's rows in its engine (exact, counted by the
replica), the engine's running-request cap (its scheduler's effective one, read once at
start), and four values from the engine's /metrics (running, queued, token usage, and
the retraction counter ``sglang:num_retracted_requests_total``). The page is read on
demand, at most every ``LOAD_PERIOD_S``: a result takes the latest values and, when
they are older, starts one refresh in the background (never two at once), so no result
waits for a scrape and an idle replica scrapes nothing. Only the four lines are read
(a startswith scan, no Prometheus parse): SGLang's page holds hundreds of histogram
lines, and this runs twice a second per replica. A failed scrape keeps the last values
(``age_s`` grows) and is logged once.

SGLang publishes its scheduler gauges with each decode log (every 40 decode steps by
default), the simulator at scrape time: the values can lag by up to a second on a GPU;
the controller decides on trends over several reports, never on one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Optional

logger = logging.getLogger("ray.serve")

LOAD_PERIOD_S = 0.5
RUNNING = "sglang:num_running_reqs"
QUEUED = "sglang:num_queue_reqs"
USAGE = "sglang:token_usage"
RETRACTED = "sglang:num_retracted_requests_total"
_FIELDS = {RUNNING: "running", QUEUED: "queued", USAGE: "token_usage", RETRACTED: "retracted"}


def read_load(metrics_text: str) -> dict[str, float]:
    """The four values of an engine's /metrics page, each summed over its label sets
    (one scheduler: one set); a missing one is 0 (SGLang writes the retraction counter
    only from its first retraction)."""
    out = dict.fromkeys(_FIELDS.values(), 0.0)
    for line in metrics_text.splitlines():
        if not line.startswith("sglang:"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        field = _FIELDS.get(name)
        if field is not None:
            try:
                out[field] += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return out


class LoadProbe:
    """One replica's view of its engine's load (see the module docstring)."""

    def __init__(self, metrics_text: Callable[[], Awaitable[str]], cap: int, replica: str,
                 period_s: float = LOAD_PERIOD_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._metrics_text = metrics_text
        self.cap, self.replica, self.period_s, self._clock = cap, replica, period_s, clock
        self.values = dict.fromkeys(_FIELDS.values(), 0.0)
        self.read_at: Optional[float] = None  # when the values were read (None: never)
        self._refresh: Optional[asyncio.Task] = None
        self._warned = False

    def snapshot(self, inflight: int) -> dict[str, Any]:
        """The load to send with a result; starts a refresh when the values are stale."""
        now = self._clock()
        if (self.read_at is None or now - self.read_at >= self.period_s) and (
                self._refresh is None or self._refresh.done()):
            self._refresh = asyncio.get_running_loop().create_task(self.refresh())
        age = None if self.read_at is None else round(now - self.read_at, 3)
        return {"replica": self.replica, "cap": self.cap, "inflight": inflight,
                **self.values, "age_s": age}

    async def refresh(self) -> None:
        try:
            text = await self._metrics_text()
        except Exception as exc:  # noqa: BLE001 - a missed scrape only ages the values
            if not self._warned:
                self._warned = True
                logger.warning("engine load scrape failed (later failures not logged): %r", exc)
            return
        self.values, self.read_at = read_load(text), self._clock()
