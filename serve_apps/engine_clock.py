"""The engine's idle clock, published for the job: how long this replica's engine had
nothing to do.

SGLang counts it itself: ``sglang:scheduler_idle_seconds_total`` is the wall time its
scheduler had no runnable or queued request (SGLang 0.5.23, ``metrics_reporter.py``; the
simulator counts the same). The replica's relay loop scrapes the engine's /metrics
anyway; after each scrape it publishes the counter, its scrape time and whether the engine
had work then, with when the engine started and became ready, under one key per replica in
Ray's GCS key-value store (namespace ``raygen``). The job's driver reads the keys of its
app (jobs/runs/engine_idle.py) and turns them into idle GPU-seconds per session.

Why the key-value store: the driver can neither reach an engine (it listens on its own
node's 127.0.0.1) nor address one replica through Serve's router, and a detached actor
would cost a process. A record keeps the last ``SAMPLES_KEPT`` samples (two minutes), so a
reader polling every few seconds misses none; a replica that stops deletes its key, one
that crashed leaves it (the driver drops keys older than ``STALE_KEY_S``).
"""

from __future__ import annotations

import collections
import json
import logging
import time
from typing import Any, Callable, Optional

logger = logging.getLogger("ray.serve")

NAMESPACE = "raygen"
PREFIX = "engine-clock/"
FORMAT = 1
SAMPLES_KEPT = 24
STALE_KEY_S = 3600.0
IDLE_COUNTER = "sglang:scheduler_idle_seconds_total"
WORK_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs")


def key(app: str, replica: str) -> str:
    return f"{PREFIX}{app}/{replica}"


def _kv():
    from ray.experimental import internal_kv
    return internal_kv


class EngineClock:
    """One replica's record: started_at / ready_at (wall s) and [t, idle_s, busy] samples."""

    def __init__(self, app: str, replica: str, started_at: float, ready_at: float,
                 put: Optional[Callable[[str, bytes], Any]] = None,
                 delete: Optional[Callable[[str], Any]] = None):
        self.key = key(app, replica)
        self.record: dict[str, Any] = {"format": FORMAT, "app": app, "replica": replica,
                                       "started_at": started_at, "ready_at": ready_at}
        self.samples: collections.deque = collections.deque(maxlen=SAMPLES_KEPT)
        self._put = put or (lambda k, v: _kv()._internal_kv_put(k, v, namespace=NAMESPACE))
        self._delete = delete or (lambda k: _kv()._internal_kv_del(k, namespace=NAMESPACE))

    def publish(self, values: dict[str, float], now: Optional[float] = None) -> bool:
        """Record one scrape's values (sample name -> value); False if the engine does
        not count its idle time (nothing is published then)."""
        idle = values.get(IDLE_COUNTER)
        if idle is None:
            return False
        busy = any(values.get(name, 0.0) > 0 for name in WORK_GAUGES)
        self.samples.append([round(now or time.time(), 3), round(idle, 3), busy])
        self._put(self.key, json.dumps(dict(self.record, samples=list(self.samples))).encode())
        return True

    def close(self) -> None:
        try:
            self._delete(self.key)
        except Exception as exc:  # noqa: BLE001 - a stale key only ages out
            logger.warning("engine clock key %s not deleted: %s", self.key, exc)


def read_records(app: str) -> list[dict[str, Any]]:
    """Every replica record of ``app`` (in the driver, Ray connected)."""
    kv = _kv()
    out = []
    for k in kv._internal_kv_list(key(app, ""), namespace=NAMESPACE) or []:
        raw = kv._internal_kv_get(k, namespace=NAMESPACE)
        try:
            record = json.loads(raw) if raw else None
        except ValueError:
            record = None
        if not record or record.get("format") != FORMAT:
            continue  # unreadable or a later format: not counted
        samples = record.get("samples") or []
        if samples and time.time() - samples[-1][0] > STALE_KEY_S:
            kv._internal_kv_del(k, namespace=NAMESPACE)  # a replica that crashed long ago
            continue
        out.append(record)
    return out
