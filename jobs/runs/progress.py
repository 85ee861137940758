"""progress.json, computed from what is durably written, never from in-memory counters.

A background thread in the driver re-lists the run's folders every few seconds, reads
only files it has not seen (a few columns each), and derives every count from them,
so progress always agrees with the output (the story's resume file said 9,500 done
while progress.json said 5,623). Rates are windowed; ETA = remaining / recent rate.
The same figures are set as Ray gauges for the dashboard and alerts.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from jobs.pipeline.rows import reject_reason_class
from jobs.io.run_store import RunStore
from jobs.io.storage import list_files, write_json_atomic

logger = logging.getLogger("raygen")
RATE_WINDOW_S = 120.0


@dataclass
class RunCounts:
    latest: dict[str, tuple[int, bool, int]] = field(default_factory=dict)  # key -> (v, cut, tok)
    failed: set[str] = field(default_factory=set)
    rejected: set[str] = field(default_factory=set)
    bytes_written: int = 0
    quarantined: int = 0   # damaged parts moved to quarantine/ (their rows are not done)
    last_write_ts: float = 0.0
    seen_files: set[str] = field(default_factory=set)
    # (metric, label) of outcomes in files first seen since the last drain: the job's
    # failure/retry/reject counters come from durable rows, in the long-lived driver
    # (short-lived Ray workers lose increments they have not reported yet).
    events: list[tuple[str, str]] = field(default_factory=list)

    def scan(self, store: RunStore) -> None:
        for kind in ("data", "failures", "rejects"):
            for info in list_files(store.loc(kind), ".parquet"):
                if info.path in self.seen_files:
                    continue
                self._add(kind, store, info.path)
                self.seen_files.add(info.path)
                self.bytes_written += info.size or 0
                if info.mtime is not None:
                    self.last_write_ts = max(self.last_write_ts, info.mtime.timestamp())
        self.quarantined = len(store.quarantined())

    def _add(self, kind: str, store: RunStore, path: str) -> None:
        if kind == "data":
            t = store.read_part(path, ["key", "version", "finish_reason", "completion_tokens",
                                       "retry_classes"])
            for key, version, finish, tokens, _ in zip(*(c.to_pylist() for c in t.columns)):
                if key not in self.latest or self.latest[key][0] < version:
                    self.latest[key] = (version, finish == "length", tokens or 0)
        elif kind == "failures":
            t = store.read_part(path, ["key", "error_class", "retry_classes"])
            self.failed.update(t.column("key").to_pylist())
            self.events += [("failures", c.removeprefix("continuation:"))
                            for c in t.column("error_class").to_pylist()]
        else:
            t = store.read_part(path, None)  # reject_id: content identity (older parts: line)
            ids = t.column("reject_id").to_pylist() if "reject_id" in t.column_names else []
            self.rejected.update(i or f"{s}:{n}" for i, s, n in zip(
                ids or [None] * t.num_rows, t.column("source").to_pylist(),
                t.column("line").to_pylist()))
            self.events += [("rejects", reject_reason_class(r or ""))
                            for r in t.column("reason").to_pylist()]
        if kind != "rejects":
            self.events += [("retries", c) for classes in t.column("retry_classes").to_pylist()
                            for c in classes or ()]

    @property
    def done(self) -> int:
        return len(self.latest)

    @property
    def truncated(self) -> int:
        return sum(1 for _, cut, _ in self.latest.values() if cut)

    @property
    def output_tokens(self) -> int:
        return sum(tok for _, _, tok in self.latest.values())

    @property
    def failed_open(self) -> int:
        return len(self.failed - self.latest.keys())


class ProgressTracker:
    def __init__(self, store: RunStore, total: int, run: str, model: str,
                 interval_s: float, gauges: Optional[Any] = None):
        self.store, self.total, self.run, self.model = store, total, run, model
        self.interval_s, self.gauges = interval_s, gauges
        self.counts = RunCounts()
        self.started = time.time()
        self._history: collections.deque = collections.deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="progress")
        self.status = "running"
        self.baseline = (0, 0)
        self.last: Optional[dict[str, Any]] = None
        self._counting = False
        # The driver's final update and the thread's may overlap: one scan at a time, or
        # a part read by both is counted twice in the outcome counters.
        self._scan_lock = threading.Lock()

    def start(self) -> "ProgressTracker":
        self.update()
        # Rows already in the run before this session: excluded from session rates
        # and from the outcome counters.
        self.baseline = (self.counts.done, self.counts.output_tokens)
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

    def stop(self, status: str) -> dict[str, Any]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self.status = status
        return self.update()

    def _rates(self, now: float) -> tuple[float, float]:
        c = self.counts
        self._history.append((now, c.done, c.output_tokens))
        while len(self._history) > 2 and now - self._history[0][0] > RATE_WINDOW_S:
            self._history.popleft()
        t0, d0, k0 = self._history[0]
        span = now - t0
        if span <= 0:
            return 0.0, 0.0
        return (c.done - d0) / span, (c.output_tokens - k0) / span

    def update(self) -> dict[str, Any]:
        with self._scan_lock:
            return self._update()

    def _update(self) -> dict[str, Any]:
        self.counts.scan(self.store)
        now, c = time.time(), self.counts
        rows_s, tok_s = self._rates(now)
        remaining = max(self.total - c.done - c.failed_open - len(c.rejected), 0)
        snapshot = {
            "run": self.run, "model": self.model, "status": self.status,
            "total": self.total, "completed": c.done, "failed": c.failed_open,
            "rejected": len(c.rejected), "truncated": c.truncated,
            "truncated_fraction": round(c.truncated / c.done, 4) if c.done else 0.0,
            "remaining": remaining,
            "rate_rows_per_s": round(rows_s, 3), "rate_output_tok_per_s": round(tok_s, 1),
            "eta_s": round(remaining / rows_s) if rows_s > 0 else None,
            "mean_output_tokens": round(c.output_tokens / c.done, 1) if c.done else 0.0,
            "output_tokens": c.output_tokens, "bytes_written": c.bytes_written,
            "files": len(c.seen_files), "quarantined_parts": c.quarantined,
            "started_at": self.started, "updated_at": now,
            "elapsed_s": round(now - self.started, 1), "last_write_at": c.last_write_ts or self.started,
            "session_rows": c.done - self.baseline[0],
            "session_output_tokens": c.output_tokens - self.baseline[1],
        }
        self.last = snapshot
        write_json_atomic(self.store.loc("progress.json"), snapshot)
        if self.gauges is not None:
            self.gauges.set(snapshot)
            if self._counting:  # not the first scan: that one holds earlier sessions' rows
                self.gauges.count(self.counts.events)
        self.counts.events.clear()
        logger.info("progress %s: %d/%d done, %d failed, %d rejected, %.1f%% truncated, "
                    "%.2f rows/s, %.0f tok/s, eta %s", self.run, c.done, self.total,
                    c.failed_open, len(c.rejected), 100 * snapshot["truncated_fraction"],
                    rows_s, tok_s, _eta(snapshot["eta_s"]))
        return snapshot


def _eta(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}h{rest // 60:02d}m"
