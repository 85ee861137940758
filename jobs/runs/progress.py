"""progress.json, computed from what is durably written, never from in-memory counters.

A background thread in the driver re-lists the run's folders every few seconds and
refreshes the run index (jobs/io/run_index.py) with the parts it has not seen (their
sidecars, a few KB each), and derives every count from it, so progress always agrees
with the output (the story's resume file said 9,500 done while progress.json said
5,623). The driver hands over the index it read the resume state from, so neither the
first scan nor the end of the session rereads the run. Rates are windowed; ETA =
remaining / recent rate. The same figures are set as Ray gauges for the dashboard and
alerts.

GPU-hours (jobs/analysis/gpu_hours.py) are the one figure the files cannot give: what
the replicas held is measured (jobs/runs/engine_idle.py), and the run's total goes on
from what the previous progress.json says, read before this session's first write.
"""

from __future__ import annotations

import collections
import logging
import posixpath
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from jobs.analysis import gpu_hours
from jobs.io import part_summary
from jobs.io.digests import sorted_contains
from jobs.io.run_index import RunIndex
from jobs.io.run_store import RunStore
from jobs.io import s3_retry
from jobs.io.storage import read_bytes, write_json_atomic
from jobs.runs.watchdog import Watchdog

logger = logging.getLogger("raygen")
RATE_WINDOW_S = 120.0


@dataclass(frozen=True)
class InputCounts:
    """What this session's input holds, as its admission pass found it: progress counts
    the input that is, not everything the run ever held (a fixed bad line is a prompt to
    generate, not an old reject; a row whose prompt left the input is reported apart)."""

    held: int       # distinct input keys the run already held (done)
    failed: int     # distinct input keys with an open failure
    rejects: int    # rejects among the input's lines (invalid + later duplicates)
    outside: int    # keys in data/ whose prompt is no longer in the input (kept)

    @classmethod
    def of(cls, admission: Any) -> "InputCounts":
        return cls(admission.held, admission.failed_open, admission.rejects, admission.removed)


class ProgressTracker:
    def __init__(self, store: RunStore, total: int, run: str, model: str,
                 interval_s: float, gauges: Optional[Any] = None,
                 index: Optional[RunIndex] = None, watchdog: Optional[Watchdog] = None,
                 on_stall: Optional[Callable[[float, float], None]] = None,
                 counts: Optional[InputCounts] = None,
                 fence: Optional[Callable[[], Optional[str]]] = None,
                 engine_idle: Optional[Callable[[], Optional[dict]]] = None,
                 gpu_held: Optional[Callable[[], Optional[dict]]] = None,
                 gpus_per_engine: Optional[float] = None,
                 price_per_gpu_hour: Optional[float] = None):
        self.store, self.total, self.run, self.model = store, total, run, model
        self.interval_s, self.gauges = interval_s, gauges
        self.watchdog, self.on_stall = watchdog, on_stall  # fed from the thread's scans
        self.counts = counts  # None (a continuation): counts are the run's own
        # The run's lease (RunLease.fenced): once it says why, nothing more is written.
        self.fence = fence or (lambda: None)
        self.engine_idle = engine_idle  # jobs/runs/engine_idle.EngineIdleWatch
        # {gpu_s, engines} the session's replicas held so far (EngineIdleWatch.held,
        # read after engine_idle() polled); None: no engines this session
        self.gpu_held = gpu_held
        self.gpus_per_engine, self.price = gpus_per_engine, price_per_gpu_hour
        self.carried = gpu_hours.Carried()  # earlier sessions' GPU-hours, read in start()
        self.index = index if index is not None else RunIndex(store)
        self.started = time.time()
        self._history: collections.deque = collections.deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="progress")
        self.status = "running"
        self.baseline = (0, 0)
        self.baseline_rows = 0  # data rows of every version before this session
        self.baseline_replaced = (0, 0)  # index.replaced_keys / _tokens then
        self.failed_at_start: Optional[np.ndarray] = None  # open failures then
        self.lost_at_start: Optional[np.ndarray] = None  # keys of quarantined parts then
        self.last: Optional[dict[str, Any]] = None
        self._counting = False
        # The driver's final update and the thread's may overlap: one scan at a time, or
        # a part read by both is counted twice in the outcome counters.
        self._scan_lock = threading.Lock()

    def start(self) -> "ProgressTracker":
        # Rows already in the run before this session: excluded from session rates
        # and from the outcome counters; the input's counts go on from them.
        with self._scan_lock:
            # Before this session's first write replaces it: what the run spent so far.
            self.carried = gpu_hours.Carried.of(_previous(self.store))
            self.index.refresh()
            self.baseline = (len(self.index.done), self.index.output_tokens)
            self.failed_at_start = self.index.open_failed()  # sorted digests, few
            self.baseline_failed = len(self.failed_at_start)
            self.baseline_rows = self.index.data_rows
            self.baseline_replaced = (self.index.replaced_keys, self.index.replaced_tokens)
            self.lost_at_start = lost_keys(self.store, self.index)
        self.update()
        self._counting = True
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.update()
            except Exception as exc:  # a storage hiccup must not kill the run
                logger.warning("progress update failed: %s", exc)
                if self.gauges is not None and self.last is not None:
                    self.gauges.set(self.last)  # gauges vanish ~20 s after the last set()
            if self.watchdog is not None and self.on_stall is not None:
                overdue = self.watchdog.observe(len(self.index.seen))
                if overdue:
                    self.on_stall(*overdue)

    def stop(self, status: str) -> dict[str, Any]:
        self._stop.set()
        fenced = self.fence() is not None and self.last is not None
        if self._thread.is_alive():  # fenced: it may be stuck on the unreachable store
            self._thread.join(timeout=5 if fenced else 30)
        self.status = status
        if fenced:  # no rescan of a store we may not reach; the last counts are said
            return dict(self.last, status=status)
        return self.update()

    def add_final(self, fields: dict[str, Any]) -> dict[str, Any]:
        """The stopped session's snapshot with ``fields`` added (what its end found: the
        report's flagged rows), written again unless fenced."""
        self.last = dict(self.last or {}, **fields)
        if self.fence() is None:
            write_json_atomic(self.store.loc("progress.json"), self.last)
        return self.last

    def _rates(self, now: float) -> tuple[float, float]:
        done, tokens = len(self.index.done), self.index.output_tokens
        self._history.append((now, done, tokens))
        while len(self._history) > 2 and now - self._history[0][0] > RATE_WINDOW_S:
            self._history.popleft()
        t0, d0, k0 = self._history[0]
        span = now - t0
        if span <= 0:
            return 0.0, 0.0
        return (done - d0) / span, (tokens - k0) / span

    def update(self) -> dict[str, Any]:
        with self._scan_lock:
            return self._update()

    def _update(self) -> dict[str, Any]:
        c = self.index
        c.refresh()
        now = time.time()
        rows_s, tok_s = self._rates(now)
        held, failed, rejected = len(c.done), len(c.open_failed()), len(c.reject_ids)
        truncated, tokens = c.truncated, c.output_tokens  # of every key the run holds
        done, outside = held, None
        if self.counts is not None and hasattr(self, "baseline_failed"):
            # Against this session's input; every key the session adds is an input key
            # (only they are sent).
            n = self.counts
            done = n.held + held - self.baseline[0]
            failed = n.failed + failed - self.baseline_failed
            rejected, outside = n.rejects, n.outside
        remaining = max(self.total - done - failed - rejected, 0)
        retries = s3_retry.job_retries()
        snapshot = {
            "run": self.run, "model": self.model, "status": self.status,
            "total": self.total, "completed": done, "failed": failed,
            "rejected": rejected, "truncated": truncated,
            "truncated_fraction": round(truncated / held, 4) if held else 0.0,
            "remaining": remaining,
            "rate_rows_per_s": round(rows_s, 3), "rate_output_tok_per_s": round(tok_s, 1),
            "eta_s": round(remaining / rows_s) if rows_s > 0 else None,
            "mean_output_tokens": round(tokens / held, 1) if held else 0.0,
            "output_tokens": tokens, "bytes_written": c.bytes_written,
            "files": len(c.seen), "quarantined_parts": c.quarantined,
            "started_at": self.started, "updated_at": now,
            "elapsed_s": round(now - self.started, 1),
            "last_write_at": c.last_write_ts or self.started,
            # Rows this session wrote: new prompts and new versions of done ones (a
            # continue session writes only the latter).
            "session_rows": c.data_rows - self.baseline_rows,
            "session_new_prompts": len(c.done) - self.baseline[0],
            "session_output_tokens": tokens - self.baseline[1],
            # ... of which: new versions of rows held before (continued, regenerated) and
            # the tokens they added; open failures done now (--retry-failed); keys of
            # quarantined (damaged) parts written again.
            "session_new_versions": c.replaced_keys - self.baseline_replaced[0],
            "session_tokens_added": c.replaced_tokens - self.baseline_replaced[1],
            "session_retried_failures": _done_of(c, self.failed_at_start),
            "session_regenerated_damaged": _done_of(c, self.lost_at_start),
            "outside_input": outside,  # rows whose prompt left the input (not counted)
            "engine_idle_gpu_s": self.engine_idle() if self.engine_idle else None,
            "gpu_hours": self._gpu_hours(tokens - self.baseline[1], remaining,
                                         tokens / held if held else 0.0),
            # Store calls tried again after a transient S3 error, by kind (s3_retry.py).
            "s3_retries": sum(retries.values()), "s3_retries_by_kind": retries,
        }
        self.last = snapshot
        fenced = self.fence()
        if fenced:  # the lease may belong to another job by now: its progress.json
            logger.warning("progress.json not written: %s", fenced)
        else:
            write_json_atomic(self.store.loc("progress.json"), snapshot)
        events = c.take_events()
        if self.gauges is not None:
            self.gauges.set(snapshot)
            if self._counting:  # not the first scan: that one holds earlier sessions' rows
                self.gauges.count(events)
        logger.info("progress %s: %d/%d done, %d failed, %d rejected, %.1f%% truncated, "
                    "%.2f rows/s, %.0f tok/s, eta %s", self.run, done, self.total,
                    failed, rejected, 100 * snapshot["truncated_fraction"],
                    rows_s, tok_s, _eta(snapshot["eta_s"]))
        return snapshot


    def _gpu_hours(self, session_tokens: int, remaining: int,
                   mean_tokens: float) -> dict[str, Any]:
        held = self.gpu_held() if self.gpu_held is not None else None
        if self.gpu_held is None:  # no engines this session (a refused plan): it held none
            held = {"gpu_s": 0.0, "engines": 0}
        return gpu_hours.figures(
            None if held is None else held["gpu_s"], self.carried, session_tokens,
            remaining, mean_tokens, self.gpus_per_engine,
            None if held is None else held["engines"], self.price)


def _previous(store: RunStore) -> Optional[dict[str, Any]]:
    """The run's progress.json as the last session left it (None: none, or unreadable:
    the GPU-hours of sessions it held are then not known and not carried)."""
    try:
        found = store.read_json("progress.json")
    except (OSError, ValueError) as exc:
        logger.warning("earlier sessions' GPU-hours not read from progress.json: %s", exc)
        return None
    return found if isinstance(found, dict) else None


def _done_of(index: RunIndex, digests: Optional[np.ndarray]) -> int:
    if digests is None or not len(digests):
        return 0
    return int(sorted_contains(index.done, digests)[0].sum())


def lost_keys(store: RunStore, index: RunIndex) -> np.ndarray:
    """Sorted digests of the keys of quarantined data parts the run no longer holds
    (their sidecars stay in index/ when the part is moved): what a session that writes
    them again regenerated."""
    found = []
    for name in store.quarantined():
        kind, part = posixpath.split(name)
        if kind != "data":
            continue
        data = read_bytes(store.sidecar_loc("data", part))
        if data is None:
            continue
        try:  # the sidecar describes the part as written, before its damage: any size
            found.append(part_summary.decode(data, "data", None, store.key_salt)
                         .column("digest").to_numpy())
        except part_summary.BadSidecar:
            continue  # its keys are not known cheaply: not counted as regenerated
    if not found:
        return np.empty(0, np.uint64)
    keys = np.unique(np.concatenate(found))
    return keys[~sorted_contains(index.done, keys)[0]]


def _eta(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}h{rest // 60:02d}m"
