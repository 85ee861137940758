"""The engines' idle GPU-seconds of one session, from the engines' own counters.

Every replica publishes its engine's ``sglang:scheduler_idle_seconds_total`` (wall time
with no runnable or queued request, counted by SGLang itself), sampled every few seconds,
with when the engine started and became ready (serve_apps/engine_clock.py). The driver
polls them with progress.json (``EngineIdleWatch``) and splits each engine's idle time in
the session's window [engines ready for this session, now] into:

- ``ramp``: before the engine's first sampling interval with work, and that interval's idle;
- ``tail``: after its last interval with work, and that interval's idle;
- ``restarts``: replicas whose engine started after the window opened (a replacement or a
  scale-up): the seconds from its start to its readiness, the GPU held and not serving;
- ``other``: idle spells between work (a starved engine).

An interval "has work" when its idle increase is below ``WORK_FRACTION`` of its length.
Between samples the counter is interpolated; past an engine's last sample (the window
edges fall between scrapes) it is extrapolated from that sample's state (idle: the counter
runs at 1 s/s; busy: it stands still), for at most ``EXTRAPOLATE_S`` (longer: the engine is
gone). GPU-seconds = engine-seconds x GPUs per replica (a replica without a GPU, a CPU
engine or the simulator, counts as one: jobs/analysis/gpu_hours.py). None when no engine
reports the counter.

The same records give the GPU-seconds the session's replicas held (``held_gpu_seconds``,
the session's GPU-hours): each replica from its engine's start (or the session's start,
if it was up before) to its last scrape, extrapolated up to ``EXTRAPOLATE_S`` as above.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from jobs.analysis.gpu_hours import engine_weight
from serve_apps.engine_clock import read_records

logger = logging.getLogger("raygen")
WORK_FRACTION = 0.9
EXTRAPOLATE_S = 15.0  # 3 relay periods (serve_apps/engine_deployment.RELAY_PERIOD_S)
PARTS = ("ramp", "tail", "restarts", "other")


@dataclass
class Split:
    ramp: float = 0.0
    tail: float = 0.0
    restarts: float = 0.0
    other: float = 0.0

    @property
    def total(self) -> float:
        return self.ramp + self.tail + self.restarts + self.other

    def add(self, other: "Split") -> "Split":
        return Split(*(getattr(self, p) + getattr(other, p) for p in PARTS))


def _monotonic(samples: list) -> list:
    """Sorted, deduplicated, a counter reset (the value falls) read as Prometheus does."""
    out, offset, last = [], 0.0, None
    for t, idle, busy in sorted({s[0]: s for s in samples}.values()):
        if last is not None and idle < last:
            offset += last
        last = idle
        out.append((t, idle + offset, bool(busy)))
    return out


def _intervals(samples: list, start: float, end: float) -> list[tuple[float, float]]:
    """(length, idle s) of each sampling interval clipped to [start, end], in order; past
    the last sample, one interval extrapolated from its state."""
    t_last, i_last, busy = samples[-1]
    points = samples + [(t_last + EXTRAPOLATE_S, i_last + (0.0 if busy else EXTRAPOLATE_S), busy)]
    out = []
    for (ta, ia, _), (tb, ib, _) in zip(points, points[1:]):
        a, b = max(ta, start), min(tb, end)
        if b <= a or tb <= ta:
            continue
        rate = (ib - ia) / (tb - ta)  # interpolated within the interval
        out.append((b - a, min(max(rate * (b - a), 0.0), b - a)))
    return out


def engine_split(record: dict[str, Any], t0: float, t1: float) -> Optional[Split]:
    """One engine's idle seconds in [t0, t1], split (see the module docstring); None if
    it was not live in the window (a replica gone before it opened)."""
    samples = _monotonic(record.get("samples") or [])
    split = Split()
    if not samples or t1 <= t0 or samples[-1][0] + EXTRAPOLATE_S <= t0:
        return None
    ready, started = record.get("ready_at") or 0.0, record.get("started_at") or 0.0
    start = t0
    if ready > t0:  # started or replaced after the window opened
        split.restarts = max(0.0, min(ready, t1) - max(started, t0))
        start = ready
    if samples[0][0] > start:  # first scrape after the window opened: idle as its counter allows
        s0, i0, _ = samples[0]
        samples.insert(0, (start, max(i0 - (s0 - start), 0.0), False))
    end = min(t1, samples[-1][0] + EXTRAPOLATE_S)
    idle = _intervals(samples, start, end)
    working = [k for k, (length, d) in enumerate(idle) if d < WORK_FRACTION * length]
    if not working:
        split.ramp = sum(d for _, d in idle)  # no work at all in the window
        return split
    first, last = working[0], working[-1]
    for k, (_, d) in enumerate(idle):
        if k <= first:
            split.ramp += d
        elif k >= last:
            split.tail += d
        else:
            split.other += d
    return split


def idle_gpu_seconds(records: list[dict[str, Any]], t0: float, t1: float,
                     gpus_per_engine: float = 1.0) -> Optional[dict[str, Any]]:
    """progress.json's ``engine_idle_gpu_s``: the split summed over engines, in GPU-s."""
    splits = [s for s in (engine_split(r, t0, t1) for r in records) if s is not None]
    if not splits:
        return None
    total = Split()
    for split in splits:
        total = total.add(split)
    scale = engine_weight(gpus_per_engine)
    out: dict[str, Any] = {"total": round(scale * total.total, 1)}
    out.update({p: round(scale * getattr(total, p), 1) for p in PARTS})
    out["engines"] = len(splits)
    return out


def held_seconds(record: dict[str, Any], t0: float, t1: float) -> float:
    """Seconds one replica held its engine in [t0, t1]: from its engine's start (t0 if
    earlier) to its last scrape, extrapolated by at most EXTRAPOLATE_S (a replica gone
    between scrapes stops counting there)."""
    samples = record.get("samples") or []
    if not samples:
        return 0.0
    start = max(t0, record.get("started_at") or t0)
    end = min(t1, max(s[0] for s in samples) + EXTRAPOLATE_S)
    return max(0.0, end - start)


def held_gpu_seconds(records: list[dict[str, Any]], t0: float, t1: float,
                     gpus_per_engine: float = 1.0) -> Optional[dict[str, Any]]:
    """{gpu_s, engines} the replicas held in [t0, t1] (x engine_weight); None when no
    replica published a record (the engines count no idle time: nothing to read)."""
    if not records:
        return None
    held = [held_seconds(r, t0, t1) for r in records]
    return {"gpu_s": engine_weight(gpus_per_engine) * sum(held),
            "engines": sum(1 for h in held if h > 0)}


class EngineIdleWatch:
    """Polled with progress.json: keeps every sample seen of the app's replicas (a record
    holds only the last two minutes; a stopped replica's key is gone)."""

    def __init__(self, app_name: str, gpus_per_engine: float,
                 read: Optional[Callable[[str], list]] = None,
                 clock: Callable[[], float] = time.time,
                 held_since: Optional[float] = None):
        if read is None:
            read = read_records
        self.app, self.gpus, self.read, self.clock = app_name, gpus_per_engine, read, clock
        self.started = clock()  # the engines are ready for this session from here
        # The session's GPU-hours count from when it began deploying or attaching.
        self.held_since = self.started if held_since is None else min(held_since, self.started)
        self.records: dict[str, dict[str, Any]] = {}
        self.last: Optional[dict[str, Any]] = None
        self.held: Optional[dict[str, Any]] = None  # held_gpu_seconds at the last poll

    def poll(self) -> Optional[dict[str, Any]]:
        for record in self.read(self.app):
            known = self.records.setdefault(record["replica"], dict(record, samples=[]))
            known["samples"] = _merge(known["samples"], record.get("samples") or [])
        now = self.clock()
        records = list(self.records.values())
        self.held = held_gpu_seconds(records, self.held_since, now, self.gpus)
        return idle_gpu_seconds(records, self.started, now, self.gpus)

    def __call__(self) -> Optional[dict[str, Any]]:
        """poll(); a failed read keeps the last figure (it must not stop progress.json)."""
        try:
            self.last = self.poll()
        except Exception as exc:  # noqa: BLE001
            logger.warning("engine idle time not read: %s", exc)
        return self.last


def _merge(old: list, new: list) -> list:
    seen = {s[0] for s in old}
    return old + [s for s in new if s[0] not in seen]


def describe(idle: Optional[dict[str, Any]]) -> str:
    """The summary's line."""
    if not idle:
        return "  idle GPU:  not reported (the engines export no sglang:scheduler_idle_seconds_total)"
    return (f"  idle GPU:  {idle['total']} GPU-s over {idle['engines']} engines (ramp "
            f"{idle['ramp']}, tail {idle['tail']}, restarts {idle['restarts']}, "
            f"other {idle['other']})")
