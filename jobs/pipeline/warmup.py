"""Start the pipeline's processes while the admission pass and the deploy run.

``run_job`` starts this once the plan is made (while the engines are claimed and
deployed), or before the plan when a Ray cluster is already running (``cluster_running``:
connecting to it costs no start-up; a local run still starts no Ray before the plan's
reject guard refuses a bad input).

Ray Data starts its processes only when the dataset executes, after the admission pass
and the deploy. Two costs dominate its start (ray-data.log, 2-core box):

1. Its resource budget is 0 CPUs until Ray Data's autoscaling coordinator (a detached
   actor, created by the first dataset of a cluster) answers: 7-9 s to start that actor
   on a loaded 2-core box. ``start`` creates it (Ray Data's own get-or-create) first.
2. Every read, validate/admit and write task needs a Python worker process (the raylet
   starts as many at once as the node has cores; each imports ray, pyarrow, Serve and
   jobs/). ``start`` runs ``workers`` small tasks with the stages' resource shape that
   import the pipeline's modules and wait; ``release`` ends them just before the
   dataset executes, so Ray hands their idle, already-imported workers to its first
   tasks. (Ray 2.60 gives an actor a new process, never an idle task worker: the
   generate actors cannot be warmed this way; they start with the dataset, while its
   budget waits for the coordinator.)

Best effort: a failure is logged and the session goes on cold. ``RAYGEN_WARM_START=0``
switches it off (the previous start-up, for side-by-side benchmarks).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import Optional

import ray

logger = logging.getLogger("raygen")
NAMESPACE = "raygen"
HOLD_MAX_S = 3600.0     # a warm task never outlives a driver that forgot it
POLL_S = 0.1
COORDINATOR_TIMEOUT_S = 60.0


def enabled() -> bool:
    return os.environ.get("RAYGEN_WARM_START", "1") != "0"


def cluster_running() -> bool:
    """Ray connected already, or a cluster to connect to (``ray job submit`` sets
    RAY_ADDRESS): then connecting costs no cluster start."""
    return ray.is_initialized() or bool(os.environ.get("RAY_ADDRESS"))


@ray.remote(max_retries=0)
def _hold(key: str, hold_max_s: float) -> int:
    """Import what the stages import, then wait for the go (a key in GCS's KV store)."""
    import jobs.pipeline.chain  # noqa: F401 - ray.data, pyarrow, Serve's handle, jobs/
    from ray.experimental import internal_kv
    deadline = time.monotonic() + hold_max_s
    while time.monotonic() < deadline:
        if internal_kv._internal_kv_exists(key, namespace=NAMESPACE):
            break
        time.sleep(POLL_S)
    return os.getpid()


class Warmup:
    def __init__(self, workers: int, num_cpus: float):
        self.key = f"warmup/{uuid.uuid4().hex}"
        self.workers, self.num_cpus = workers, num_cpus
        self.refs: list = []
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._coordinator, daemon=True,
                                        name="warmup")

    def start(self) -> "Warmup":
        # The coordinator first: the raylet starts a node's worker processes a few at a
        # time, and the dataset's budget waits for this one.
        try:
            from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
                get_or_create_autoscaling_coordinator)
            self.coordinator = get_or_create_autoscaling_coordinator()
        except Exception as exc:  # noqa: BLE001 - Ray Data creates it itself then
            logger.warning("warm start: autoscaling coordinator not started: %s", exc)
            self.coordinator = None
        try:
            self.refs = [_hold.options(num_cpus=self.num_cpus).remote(self.key, HOLD_MAX_S)
                         for _ in range(self.workers)]
        except Exception as exc:  # noqa: BLE001 - best effort
            logger.warning("warm start: workers not started: %s", exc)
        if self.coordinator is not None:
            self._thread.start()
        return self

    def _coordinator(self) -> None:
        try:
            ray.get(self.coordinator.__ray_ready__.remote(), timeout=COORDINATOR_TIMEOUT_S)
            logger.info("warm start: Ray Data's autoscaling coordinator up in %.1f s",
                        time.monotonic() - self.started)
        except Exception as exc:  # noqa: BLE001 - Ray Data creates it itself then
            logger.warning("warm start: autoscaling coordinator not started: %s", exc)

    def release(self) -> None:
        """Let the held workers go idle, just before the dataset executes (not waiting
        for the coordinator: the generate actors start meanwhile)."""
        try:
            from ray.experimental import internal_kv
            internal_kv._internal_kv_put(self.key, b"go", namespace=NAMESPACE)
            ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
            logger.info("warm start: %d of %d workers ready after %.1f s", len(ready),
                        len(self.refs), time.monotonic() - self.started)
        except Exception as exc:  # noqa: BLE001
            logger.warning("warm start: release failed: %s", exc)

    def close(self) -> None:
        """At the session's end: the go key goes (a held task that never started is
        cancelled first, or it would wait for a key that is gone)."""
        try:
            from ray.experimental import internal_kv
            internal_kv._internal_kv_put(self.key, b"go", namespace=NAMESPACE)
            _, pending = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
            for ref in pending:
                ray.cancel(ref)
            internal_kv._internal_kv_del(self.key, namespace=NAMESPACE)
        except Exception:  # noqa: BLE001 - a leftover key only names a finished warm-up
            pass


def start(workers: int, num_cpus: float) -> Optional[Warmup]:
    """A started warm-up, or None when switched off."""
    return Warmup(workers, num_cpus).start() if enabled() else None
