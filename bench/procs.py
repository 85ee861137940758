"""CPU time and RSS of the benchmark's process tree, by role and component.

Every process of the run descends from the driver: ``ray.init(address="local")``
starts gcs_server, raylet, the dashboard and the log monitor as the driver's
children; raylet starts every worker (Serve controller and replicas, Ray Data
actors and task workers, the agents); a replica starts its engine (guard +
simulator). Roles:

- ``driver``      the benchmark/driver process (minus the benchmark's own sampler
                  threads, whose CPU is measured with thread_time and subtracted)
- ``ray_workers`` Ray Data actors and task workers, KeyLedger, idle pooled workers
- ``serve``       ServeController and ServeReplica actors (the replica's Python
                  process only; its engine subtree is excluded)
- ``ray_system``  gcs_server, raylet, dashboard (+ its module processes),
                  DashboardAgent, RuntimeEnvAgent, log monitor, autoscaler monitor
- excluded        engine processes (engine_guard + simulator), the moto S3 server,
                  the plain client (measured on its own)

CPU of a process = user + system; its children_user + children_system (children
that exited and were reaped) are added too, so workers that exit during a window
are still counted: raylet's reaped children are booked as ``exited_workers``
(role ray_workers), not as raylet. A window's CPU is the difference of two
snapshots. Components (COMPONENTS) give the finer split.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

import psutil

ROLES = ("driver", "ray_workers", "serve", "ray_system")
EXCLUDE_MARKERS = ("serve_apps.engine_guard", "serve_apps.engines.simulator", "moto.server",
                   "bench.plain_client")
SYSTEM_MARKERS = ("gcs_server", "raylet", "dashboard", "DashboardAgent", "RuntimeEnvAgent",
                  "log_monitor", "monitor.py", "resource_tracker", "forkserver")


COMPONENTS = {  # component -> role
    "driver": "driver",
    "ray_data_workers": "ray_workers", "exited_workers": "ray_workers",
    "serve_controller": "serve", "serve_replicas": "serve",
    "raylet": "ray_system", "gcs_server": "ray_system", "dashboard": "ray_system",
    "dashboard_agent": "ray_system", "runtime_env_agent": "ray_system",
    "log_monitor": "ray_system", "autoscaler_monitor": "ray_system",
    "other_ray": "ray_system",
}


def classify(proc: psutil.Process, root_pid: int) -> Optional[str]:
    """The process's component (see COMPONENTS), or None when it is excluded."""
    if proc.pid == root_pid:
        return "driver"
    try:
        cmd = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        cmd = ""
    if not cmd:
        try:
            cmd = proc.name()
        except psutil.Error:
            return None
    if any(m in cmd for m in EXCLUDE_MARKERS):
        return None
    if "default_worker.py" in cmd and not cmd.startswith("ray::"):
        return "ray_data_workers"  # not titled yet
    if "ServeController" in cmd:
        return "serve_controller"
    if "ServeReplica" in cmd:
        return "serve_replicas"
    for marker, component in (("raylet", "raylet"), ("gcs_server", "gcs_server"),
                              ("DashboardAgent", "dashboard_agent"),
                              ("RuntimeEnvAgent", "runtime_env_agent"),
                              ("dashboard", "dashboard"), ("forkserver", "dashboard"),
                              ("resource_tracker", "dashboard"),
                              ("log_monitor", "log_monitor"), ("monitor.py", "autoscaler_monitor")):
        if marker in cmd:
            return component
    if cmd.startswith("ray::") or "default_worker.py" in cmd:
        return "ray_data_workers"
    return "other_ray"  # anything else Ray started (kept, never silently dropped)


@dataclass
class Snapshot:
    at: float
    cpu_s: dict[str, float]  # by component
    rss: dict[str, int]


@dataclass
class ProcTree:
    root_pid: int = field(default_factory=os.getpid)
    extra_exclude: set[int] = field(default_factory=set)
    _roles: dict[int, Optional[str]] = field(default_factory=dict)
    _procs: dict[int, psutil.Process] = field(default_factory=dict)

    def processes(self) -> list[tuple[psutil.Process, str]]:
        root = psutil.Process(self.root_pid)
        out: list[tuple[psutil.Process, str]] = []
        excluded: set[int] = set(self.extra_exclude)
        try:
            descendants = root.children(recursive=True)
        except psutil.Error:
            descendants = []
        for proc in [root, *descendants]:
            pid = proc.pid
            if pid in excluded:
                continue
            try:
                parent = proc.ppid()
            except psutil.Error:
                continue
            if parent in excluded:  # the whole subtree of an excluded process
                excluded.add(pid)
                continue
            cached = self._procs.get(pid)
            if cached is None or not _same(cached, proc):
                self._procs[pid] = cached = proc
                self._roles.pop(pid, None)
            role = self._roles.get(pid)
            if role is None:
                role = classify(cached, self.root_pid)
                # A worker shows its launch command line until it sets its title
                # (ray::IDLE, ray::MapWorker(...), ray::ServeReplica...): classify
                # it again next time instead of caching a guess.
                if role != "ray_data_workers":
                    self._roles[pid] = role
            if role is None:
                excluded.add(pid)
                continue
            out.append((cached, role))
        return out

    def snapshot(self) -> Snapshot:
        """CPU seconds by component; RSS bytes by role."""
        cpu = dict.fromkeys(COMPONENTS, 0.0)
        rss = dict.fromkeys(ROLES, 0)
        for proc, component in self.processes():
            try:
                with proc.oneshot():
                    t = proc.cpu_times()
                    mem = proc.memory_info().rss
            except psutil.Error:
                continue
            cpu[component] += t.user + t.system
            # Children that exited and were reaped: raylet reaps the Ray workers it
            # started (Ray Data task workers, killed idle workers).
            reaped = t.children_user + t.children_system
            cpu["exited_workers" if component == "raylet" else component] += reaped
            rss[COMPONENTS[component]] += mem
        return Snapshot(time.time(), cpu, rss)


def _same(a: psutil.Process, b: psutil.Process) -> bool:
    try:
        return a.create_time() == b.create_time()
    except psutil.Error:
        return False


class RssSampler:
    """Samples RSS by role every ``period_s``; keeps the peak of each sum."""

    def __init__(self, tree: ProcTree, period_s: float = 0.5):
        self.tree, self.period_s = tree, period_s
        self.peak: dict[str, int] = dict.fromkeys(ROLES, 0)
        self.peak_workers_total = 0  # driver + ray_workers + serve, summed per sample
        self.samples = 0
        self.thread_cpu_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="bench-rss")

    def _loop(self) -> None:
        cpu0 = time.thread_time()
        while True:
            snap = self.tree.snapshot()
            for role, value in snap.rss.items():
                self.peak[role] = max(self.peak[role], value)
            total = snap.rss["driver"] + snap.rss["ray_workers"] + snap.rss["serve"]
            self.peak_workers_total = max(self.peak_workers_total, total)
            self.samples += 1
            self.thread_cpu_s = time.thread_time() - cpu0
            if self._stop.wait(self.period_s):
                return

    def start(self) -> "RssSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def rss_of(pid: int) -> int:
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0
