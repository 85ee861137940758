"""CPU time and RSS of the benchmark's process tree, by role and component.

Every process of the run descends from the driver: ``ray.init(address="local")``
starts gcs_server, raylet, the dashboard and the log monitor as the driver's
children; raylet starts every worker (Serve controller and replicas, Ray Data
actors and task workers, the agents); a replica starts its engine (guard +
simulator). Roles:

- ``driver``      the benchmark/driver process (minus the benchmark's own sampler
                  threads, whose CPU is measured with thread_time and subtracted)
- ``ray_workers`` Ray Data actors and task workers, idle pooled workers
- ``serve``       ServeController and ServeReplica actors (the replica's Python
                  process only; its engine subtree is excluded)
- ``ray_system``  gcs_server, raylet, dashboard (+ its module processes),
                  DashboardAgent, RuntimeEnvAgent, log monitor, autoscaler monitor
- excluded        engine processes (engine_guard and everything below it: the
                  simulator, or SGLang's server, scheduler and detokenizer; their CPU
                  is measured apart by ``engine_cpu_s``), the moto S3 server, the
                  plain client (measured on its own)

CPU of a process = user + system; its children_user + children_system (children
that exited and were reaped) are added too, so workers that exit during a window
are still counted: raylet's reaped children are booked as ``exited_workers``
(role ray_workers), not as raylet. A window's CPU is the difference of two
snapshots. Components (COMPONENTS) give the finer split.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

import psutil

ROLES = ("driver", "ray_workers", "serve", "ray_system")
EXCLUDE_MARKERS = ("serve_apps.engine_guard", "serve_apps.engines.simulator", "moto.server",
                   "bench.plain_client", "bench.sampler")
SYSTEM_MARKERS = ("gcs_server", "raylet", "dashboard", "DashboardAgent", "RuntimeEnvAgent",
                  "log_monitor", "monitor.py", "resource_tracker", "forkserver")


COMPONENTS = {  # component -> role
    "driver": "driver",
    "generate_actors": "ray_workers",
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
    try:
        name = proc.name()
    except psutil.Error:
        name = ""
    if name in ("raylet", "gcs_server"):  # their command lines mention default_worker.py
        return name
    if "default_worker.py" in cmd and not cmd.startswith("ray::"):
        return "ray_data_workers"  # not titled yet
    if "ServeController" in cmd:
        return "serve_controller"
    if "ServeReplica" in cmd:
        return "serve_replicas"
    for marker, component in (("DashboardAgent", "dashboard_agent"),
                              ("RuntimeEnvAgent", "runtime_env_agent"),
                              ("dashboard", "dashboard"), ("forkserver", "dashboard"),
                              ("resource_tracker", "dashboard"),
                              ("log_monitor", "log_monitor"), ("monitor.py", "autoscaler_monitor")):
        if marker in cmd:
            return component
    if cmd.startswith("ray::MapWorker("):  # GenerateRows / ray.data.llm stage actors
        return "generate_actors"
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
                if role not in ("ray_data_workers", "generate_actors"):
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


def engine_cpu_s(root_pid: int) -> float:
    """CPU seconds (user + system, reaped children included) of every engine below
    ``root_pid``: each engine_guard process and its whole subtree."""
    total = 0.0
    try:
        procs = psutil.Process(root_pid).children(recursive=True)
    except psutil.Error:
        return 0.0
    guards = set()
    for proc in procs:
        try:
            if "serve_apps.engine_guard" in " ".join(proc.cmdline()):
                guards.add(proc.pid)
        except psutil.Error:
            continue
    for proc in procs:
        try:
            if proc.pid in guards or any(p.pid in guards for p in proc.parents()):
                t = proc.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return total


def _same(a: psutil.Process, b: psutil.Process) -> bool:
    try:
        return a.create_time() == b.create_time()
    except psutil.Error:
        return False


class RssSampler:
    """Runs bench.sampler (RSS by role every ``period_s``, peaks kept) in its own process."""

    def __init__(self, tree: ProcTree, period_s: float = 0.5):
        self.tree, self.period_s = tree, period_s
        self.peak: dict[str, int] = dict.fromkeys(ROLES, 0)
        self.peak_workers_total = 0  # driver + ray_workers + serve, summed per sample
        self.samples = 0
        self.thread_cpu_s = 0.0  # nothing runs in the driver
        self._proc: Optional[subprocess.Popen] = None
        self._out = ""

    def start(self) -> "RssSampler":
        import tempfile
        fd, self._out = tempfile.mkstemp(prefix="bench-rss-", suffix=".json")
        os.close(fd)
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [repo, *filter(None, [os.environ.get("PYTHONPATH")])]))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "bench.sampler", "--root", str(self.tree.root_pid),
             "--period", str(self.period_s), "--out", self._out], env=env, cwd=repo)
        return self

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        self._proc.wait(timeout=30)
        import json
        try:
            with open(self._out) as f:
                data = json.load(f)
            self.peak.update(data["peak"])
            self.peak_workers_total, self.samples = data["peak_total"], data["samples"]
        finally:
            os.unlink(self._out)

