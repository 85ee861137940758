"""The soak: a long run's faults together, in one run of the story-scale demo.

    python -m bench.soak                                   # 20,000 prompts, every fault
    python -m bench.soak --prompts 300 --faults engine_kill,s3_outage --first 10 \\
        --spacing 20 --outage-s 10 --time-scale 0.02       # a few minutes: the pieces work

Starts its own moto S3 server and its own one-node Ray cluster (`ray start --head`, its
own temp dir, every port free: the head can be restarted without touching any other
cluster on the machine), uploads the demo prompts (jobs/demo_prompts.py), and runs
``python -m jobs.generate`` on jobs/configs/demo-sim.yaml (its output, app and S3
endpoint the soak's own) through two S3 proxies (bench/s3_faults.py: the run ->
outage -> throttling -> moto). Once rows are durable, the faults of ``--faults`` are
injected one after the other, ``--first`` s after the first durable rows and ``--spacing``
s apart, each no sooner than ``--settle-s`` after the last was over and once rows flow:

==============  ==================================================================
worker_kills    ``kill -9`` of ``--kills`` Ray Data workers of the data plane (bench.chaos)
engine_kill     ``kill -9`` of one engine process (the simulator below a replica)
engine_stop     ``SIGSTOP`` of one engine, left to Serve's health check; SIGCONT after
                ``--stop-s`` if it is still there
token_loop      one engine answers token id 0 looping (``/sim/faults`` broken_output):
                its replica drains itself; cleared after ``--loop-s`` if it has not
s3_throttle     ``--throttle-share`` of S3 requests answered 503 SlowDown / 500 for
                ``--throttle-s``
s3_outage       S3 unreachable (connections reset) for ``--outage-s``
driver_kill     ``kill -9`` of the driver; the same command is rerun (a resume)
head_restart    the Ray head stopped (its processes, SIGTERM then SIGKILL) and started
                again on the same ports; the driver ends; the same command is rerun
==============  ==================================================================

A driver that exits non-zero for any other reason is rerun too, and counted. At the end,
after the command has exited 0, the checks (each printed; exit 1 if one fails): every
prompt's key in data/ exactly once at its latest version (and no (key, version) twice),
no latest row with an integrity flag, no part that does not read, no engine process left
(no engine the soak saw outlives its replica, none after the cluster stops), every fault
injected, and no session ended but by the driver kill and the head restart.

Per fault: when (s after the first durable rows), what, its wall cost, its idle
engine-seconds and its outcome. Costs are measured over the fault's window (its start
to the next fault's start; the last: ``--spacing`` long, or to the end of the run) against
the ``--baseline-s`` before it (:func:`window_cost`):

- wall cost = window - rows completed in it / the rows/s before the fault: the time the
  run lost;
- idle engine-seconds = the engines' idle time in the window - the idle rate before x
  the window. An engine's idle time is its own counter
  (``sglang:scheduler_idle_seconds_total``, scraped every ``--sample-s``); an engine slot
  (of the config's replicas) with no engine answering (restarting, stopped, the cluster
  down) is idle for the whole interval (:func:`idle_increment`). The simulator's engine
  is a GPU's stand-in: one engine-second is one GPU-second of a one-GPU replica.

A markdown table and the checks go to stdout and ``<work-dir>/soak-<run>.md``; every
sample and the drivers' logs stay in the work dir.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
DEMO_CONFIG = REPO / "jobs" / "configs" / "demo-sim.yaml"
BUCKET = "raygen-soak"
APP = "raygen-soak"
ENGINE_MODULE = "serve_apps.engines.simulator"
IDLE_COUNTER = "sglang:scheduler_idle_seconds_total"  # serve_apps/engine_clock.py reads it too

FAULTS = ("worker_kills", "engine_kill", "engine_stop", "token_loop", "s3_throttle",
          "s3_outage", "driver_kill", "head_restart")
WHAT = {
    "worker_kills": "kill -9 of {kills} Ray Data workers",
    "engine_kill": "kill -9 of one engine",
    "engine_stop": "SIGSTOP of one engine",
    "token_loop": "one engine loops (broken_output token_loop)",
    "s3_throttle": "S3 throttling: {share:.0%} of requests 503/500 for {throttle:.0f} s",
    "s3_outage": "S3 outage of {outage:.0f} s",
    "driver_kill": "kill -9 of the driver, rerun",
    "head_restart": "Ray head restart, rerun",
}
# Faults whose session ends by design: the soak reruns the same command (a resume).
ENDS_SESSION = frozenset({"driver_kill", "head_restart"})


# --- the schedule and the costs (pure) ------------------------------------------------

@dataclass
class Fault:
    name: str
    at_s: float                       # planned: seconds after the first durable rows
    started: Optional[float] = None   # wall time it was injected
    ended: Optional[float] = None     # wall time it was over (restored, replaced, resumed)
    outcome: str = ""
    cost: dict = field(default_factory=dict)


def schedule(names: Sequence[str], first_s: float, spacing_s: float) -> list[Fault]:
    """The faults in the order given, the first ``first_s`` after the first durable rows,
    then one every ``spacing_s``."""
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"a fault named twice: {', '.join(names)}")
    if not names:
        raise ValueError("no fault to inject")
    if first_s < 0 or spacing_s <= 0:
        raise ValueError(f"first ({first_s}) must be >= 0 and spacing ({spacing_s}) > 0")
    return [Fault(name, first_s + i * spacing_s) for i, name in enumerate(names)]


@dataclass(frozen=True)
class Sample:
    t: float              # wall time
    completed: int        # progress.json's completed (keys done, every session)
    idle_engine_s: float  # engine-seconds idle since the soak began (cumulative)
    engines: int          # engines that answered this scrape


def at(samples: Sequence[Sample], t: float, what: str) -> float:
    """``what`` (completed or idle_engine_s) at wall time t, linear between samples,
    the first or last sample's value outside them."""
    if not samples:
        raise ValueError("no samples")
    times = [s.t for s in samples]
    if t <= times[0]:
        return float(getattr(samples[0], what))
    if t >= times[-1]:
        return float(getattr(samples[-1], what))
    i = bisect.bisect_left(times, t)
    a, b = samples[i - 1], samples[i]
    va, vb = getattr(a, what), getattr(b, what)
    return va + (vb - va) * (t - a.t) / (b.t - a.t)


def window_cost(samples: Sequence[Sample], start: float, end: float,
                baseline_s: float) -> dict[str, Any]:
    """What the window [start, end] cost against the ``baseline_s`` before it: wall s
    lost (the window less the time its rows would have taken at the rate before) and
    idle engine-seconds above the idle rate before. None where the baseline has no rows
    (a rate of 0 makes no time)."""
    if end <= start:
        raise ValueError(f"empty window [{start}, {end}]")
    base0 = max(start - baseline_s, samples[0].t) if samples else start - baseline_s
    base = start - base0
    rows = at(samples, end, "completed") - at(samples, start, "completed")
    idle = at(samples, end, "idle_engine_s") - at(samples, start, "idle_engine_s")
    if base <= 0:
        return {"window_s": end - start, "rows": rows, "rate_before": None,
                "wall_cost_s": None, "idle_engine_s": idle, "idle_cost_engine_s": None}
    rate = (at(samples, start, "completed") - at(samples, base0, "completed")) / base
    idle_rate = (at(samples, start, "idle_engine_s") - at(samples, base0, "idle_engine_s")) / base
    return {"window_s": end - start, "rows": rows, "rate_before": rate,
            "wall_cost_s": (end - start) - rows / rate if rate > 0 else None,
            "idle_engine_s": idle, "idle_cost_engine_s": idle - idle_rate * (end - start)}


def windows(faults: Sequence[Fault], spacing_s: float, settle_s: float, run_end: float
            ) -> list[tuple[Fault, float, float]]:
    """Each injected fault's window: its start to the next injected fault's start (which
    is at least ``settle_s`` after it was over); the last one as long as ``spacing_s`` or
    until ``settle_s`` after it was over (a rerun's resume: its recovery is its cost),
    whichever is longer, and never past the run's end."""
    done = [f for f in faults if f.started is not None]
    out = []
    for i, fault in enumerate(done):
        if i + 1 < len(done):
            end = done[i + 1].started
        else:
            over = fault.ended if fault.ended is not None else fault.started
            end = min(max(fault.started + spacing_s, over + settle_s), run_end)
        out.append((fault, fault.started, max(end, fault.started + 1e-3)))
    return out


def idle_increment(before: dict[int, float], now: dict[int, float], dt: float,
                   slots: int) -> float:
    """Idle engine-seconds of one sampling interval of ``dt`` s: each engine that
    answered at both ends adds its idle counter's increase (within [0, dt]); each of the
    ``slots`` engines the config runs without such an engine (restarting, stopped, its
    cluster down) adds the whole interval."""
    both = [pid for pid in now if pid in before]
    idle = sum(min(max(now[p] - before[p], 0.0), dt) for p in both)
    return idle + max(slots - len(both), 0) * dt


# --- processes of the soak's own cluster ----------------------------------------------

def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _started(pid: int) -> Optional[str]:
    from cluster.local_stack import _started as started  # local: bench stays light to import
    return started(pid)


def engine_port(argv: list[str]) -> Optional[int]:
    """The port of a simulator engine's command line; None for any other process (its
    guard's command line names the engine's module only after ``--``)."""
    if len(argv) < 3 or argv[1:3] != ["-m", ENGINE_MODULE] or "--port" not in argv:
        return None
    try:
        return int(argv[argv.index("--port") + 1])
    except (IndexError, ValueError):
        return None


class OwnCluster:
    """A one-node Ray cluster of the soak's own: `ray start --head` in its own temp dir,
    every port chosen free once and kept over a restart; found and stopped by its own
    processes (cluster.local_stack.stop_session), never by `ray stop`."""

    def __init__(self, num_cpus: int = 8):
        import tempfile

        from cluster.local_stack import ray_auth_env
        from serve_apps.engine_process import free_port
        self.temp_dir = tempfile.mkdtemp(prefix="rsoak", dir="/tmp")  # short: socket paths
        self.gcs_port = free_port()
        self.address = f"127.0.0.1:{self.gcs_port}"
        self.args = ["--head", "--port", str(self.gcs_port), "--num-cpus", str(num_cpus),
                     "--include-dashboard", "false", "--dashboard-port", str(free_port()),
                     "--disable-usage-stats",
                     "--temp-dir", self.temp_dir,
                     "--ray-client-server-port", str(free_port()),
                     "--node-manager-port", str(free_port()),
                     "--object-manager-port", str(free_port()),
                     "--dashboard-agent-listen-port", str(free_port()),
                     "--dashboard-agent-grpc-port", str(free_port()),
                     "--runtime-env-agent-port", str(free_port()),
                     "--metrics-export-port", str(free_port())]
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        self.env = ray_auth_env({
            **env, "RAY_USAGE_STATS_ENABLED": "0",
            "DASHBOARD_METRIC_PORT": str(free_port()),
            "AUTOSCALER_METRIC_PORT": str(free_port()),
            "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])]),
            # Ray's housekeeping at the test suite's pace on this 2-core machine
            # (tests/integration/conftest.py): log monitor, Serve's control loop.
            "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0", "LOG_NAME_UPDATE_INTERVAL_S": "5",
            "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.3",
            "RAY_prestart_worker_first_driver": "0",
            # on a loaded shared machine a raylet may take long to register
            # (tests/integration/two_node.py)
            "RAY_raylet_start_wait_time_s": "180"})

    def start(self, attempts: int = 3) -> None:
        """`ray start`; on a loaded machine it can miss its own deadlines: what it started
        is stopped and it is tried again."""
        from cluster.local_stack import RAY_BIN
        for attempt in range(attempts):
            try:
                out = subprocess.run([RAY_BIN, "start", *self.args], env=self.env,
                                     capture_output=True, text=True, timeout=300, cwd=REPO)
                failed = "" if out.returncode == 0 else f"{out.stdout[-1500:]}\n{out.stderr[-1500:]}"
            except subprocess.TimeoutExpired:
                failed = "ray start timed out (300 s)"
            if not failed:
                return
            self.stop()
            print(f"[soak] ray start failed (attempt {attempt + 1} of {attempts}):\n{failed}",
                  flush=True)
        raise RuntimeError(f"ray start failed {attempts} times")

    def stop(self) -> None:
        from cluster.local_stack import stop_session
        stop_session(self.temp_dir, grace_s=10)

    def pids(self) -> list[int]:
        from cluster.local_stack import session_pids
        return session_pids(self.temp_dir)

    def raylets(self) -> list:
        import psutil
        out = []
        for pid in self.pids():
            argv = _cmdline(pid)
            if argv and argv[0].endswith("/raylet"):
                try:
                    out.append(psutil.Process(pid))
                except psutil.Error:
                    pass
        return out

    def engines(self) -> dict[int, int]:
        """pid -> port of every simulator engine below this cluster's processes."""
        from cluster.local_stack import descendants
        out = {}
        for pid in descendants(self.pids()):
            port = engine_port(_cmdline(pid))
            if port is not None and _started(pid) is not None:
                out[pid] = port
        return out

    def job_env(self) -> dict[str, str]:
        return {**self.env, "RAY_ADDRESS": self.address}


def scrape_idle(port: int, timeout_s: float = 2.0) -> Optional[float]:
    """The engine's idle counter; None when it does not answer (stopped, gone)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as r:
            text = r.read().decode()
    except (OSError, ValueError):
        return None
    total = None
    for line in text.splitlines():
        if line.startswith(IDLE_COUNTER):
            try:
                total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
    return total


def set_faults(port: int, **faults: Any) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/sim/faults", method="POST",
                                 data=json.dumps(faults).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


# --- the run ---------------------------------------------------------------------------

def wait_for(cond: Callable[[], Any], timeout_s: float, period_s: float = 0.5) -> Any:
    """cond()'s first truthy value within timeout_s, else None."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(period_s)


class Soak:
    def __init__(self, args: argparse.Namespace, cluster: OwnCluster, store, cfg_path: Path,
                 throttle, flaky, slots: int):
        self.args, self.cluster, self.store, self.cfg_path = args, cluster, store, cfg_path
        self.throttle, self.flaky, self.slots = throttle, flaky, slots
        self.rng = random.Random(args.seed)
        self.samples: list[Sample] = []
        self.engines_seen: dict[int, Optional[str]] = {}  # pid -> start time
        self.attempts: list[dict[str, Any]] = []
        self.driver: Optional[subprocess.Popen] = None
        self.driver_started = 0.0
        self.end_cause: Optional[str] = None  # the fault that ends the running session
        self.may_start = threading.Event()
        self.may_start.set()
        self.done = threading.Event()
        self.first_rows_at: Optional[float] = None
        self.lock = threading.Lock()

    # the driver: the same command until it exits 0
    def drive(self, max_attempts: int) -> bool:
        cmd = [sys.executable, "-m", "jobs.generate", "--config", str(self.cfg_path)]
        for n in range(max_attempts):
            self.may_start.wait()
            with open(Path(self.args.work_dir) / f"{self.cfg_path.stem}-driver-{n}.log",
                      "w") as log:
                with self.lock:
                    self.driver = subprocess.Popen(cmd, env=self.cluster.job_env(), cwd=REPO,
                                                   stdout=log, stderr=subprocess.STDOUT)
                    self.driver_started = time.time()
                    self.end_cause = None
                code = self.driver.wait()
            with self.lock:
                cause = self.end_cause or ("succeeded" if code == 0 else "unplanned")
                self.attempts.append({"attempt": n, "started": self.driver_started,
                                      "ended": time.time(), "exit_code": code, "ended_by": cause,
                                      "log": log.name})
            print(f"[soak] driver attempt {n}: exit {code} ({cause})", flush=True)
            if code == 0:
                return True
        return False

    # the samples: progress and the engines' idle time
    def sample_loop(self) -> None:
        prev: dict[int, float] = {}
        prev_t, idle, completed = time.time(), 0.0, 0
        while not self.done.is_set():
            try:
                progress = self.store.read_json("progress.json") or {}
                completed = int(progress.get("completed", completed))
            except Exception:  # noqa: BLE001 - a read in an outage: the last value stands
                pass
            now_t = time.time()
            engines = self.cluster.engines()
            for pid in engines:
                if pid not in self.engines_seen:
                    self.engines_seen[pid] = _started(pid)
            now = {pid: v for pid, port in engines.items()
                   if (v := scrape_idle(port)) is not None}
            idle += idle_increment(prev, now, now_t - prev_t, self.slots)
            prev, prev_t = now, now_t
            self.samples.append(Sample(now_t, completed, idle, len(now)))
            if completed and self.first_rows_at is None:
                self.first_rows_at = now_t
            self.done.wait(self.args.sample_s)

    def completed(self) -> int:
        return self.samples[-1].completed if self.samples else 0

    def ended(self) -> bool:
        """The current driver has exited (its returncode: Popen.poll() from a thread
        other than the one waiting on it reads None)."""
        return self.driver is not None and self.driver.returncode is not None

    def rows_flowing(self, after: float = 0.0, timeout_s: float = 600) -> str:
        """Wait until a driver started after ``after`` has made rows durable (after a
        rerun: its resume is under way): "flowing"; "over" if the soak's driving ended
        first, "" if neither came within timeout_s."""
        def flowing():
            if self.done.is_set():
                return "over"
            if self.driver is None or self.driver_started < after:
                return ""
            since = [s.completed for s in self.samples if s.t >= self.driver_started + 1]
            return "flowing" if len(since) >= 2 and since[-1] > since[0] else ""
        return wait_for(flowing, timeout_s, 1.0)

    def _resumed(self, t0: float) -> str:
        state = self.rows_flowing(after=t0)
        last = self.attempts[-1] if self.attempts else {}
        if state == "flowing":
            return f"rerun resumed, rows durable again after {time.time() - t0:.0f} s"
        if state == "over" and last.get("exit_code") == 0:
            return "rerun finished the run"
        return f"the rerun made no rows ({len(self.attempts)} attempts so far)"

    def faults_loop(self, faults: list[Fault]) -> None:
        wait_for(lambda: self.first_rows_at or self.done.is_set(), 1800, 1.0)
        if self.first_rows_at is None:
            return
        last_end = 0.0
        for fault in faults:
            # its planned time, and never before the last fault has been over --settle-s:
            # a window and its baseline each see one fault
            due = max(self.first_rows_at + fault.at_s, last_end + self.args.settle_s)
            while time.time() < due and not self.done.is_set():
                time.sleep(0.5)
            state = self.rows_flowing()
            if state != "flowing":
                fault.outcome = "not injected: " + ("the run was over" if state == "over"
                                                    else "no rows flowing for 600 s")
                continue
            print(f"[soak] {time.time() - self.first_rows_at:7.1f} s: {fault.name}", flush=True)
            fault.started = time.time()
            try:
                fault.outcome = getattr(self, f"inject_{fault.name}")()
            except Exception as exc:  # noqa: BLE001 - reported as the fault's outcome
                fault.outcome = f"injection failed: {type(exc).__name__}: {exc}"
            fault.ended = last_end = time.time()
            print(f"[soak] {fault.name}: {fault.outcome}", flush=True)
            self.save(faults)

    def save(self, faults: Sequence[Fault]) -> None:
        """What the soak has so far, in <work-dir>/<run>.partial.json (the end writes the
        whole of it beside)."""
        path = Path(self.args.work_dir) / f"{self.cfg_path.stem}.partial.json"
        path.write_text(json.dumps({"faults": [asdict(f) for f in faults],
                                    "attempts": self.attempts,
                                    "samples": [asdict(s) for s in self.samples]},
                                   default=str))

    # the faults: each returns its outcome
    def _an_engine(self) -> tuple[int, int]:
        engines = wait_for(self.cluster.engines, 120)
        if not engines:
            raise RuntimeError("no engine running")
        pid = self.rng.choice(sorted(engines))
        return pid, engines[pid]

    def _replaced(self, pid: int, timeout_s: float) -> Optional[float]:
        """Seconds until ``pid`` is gone and the config's engines answer again."""
        t0 = time.time()
        gone = wait_for(lambda: _started(pid) is None, timeout_s)
        if not gone:
            return None
        back = wait_for(lambda: sum(scrape_idle(p) is not None
                                    for p in self.cluster.engines().values()) >= self.slots,
                        max(timeout_s - (time.time() - t0), 1))
        return time.time() - t0 if back else None

    def inject_worker_kills(self) -> str:
        from bench.chaos import Killer, workers_below
        killer = Killer(0, self.rng, self.args.kills, interval_s=(2.0, 5.0),
                        find=lambda: workers_below(self.cluster.raylets()))
        killer.run(_Polled(self.ended))
        stages = ", ".join(sorted({k.replace("ray::", "") for k in killer.killed}))
        return f"{len(killer.killed)} killed ({stages}); session " + (
            "ENDED" if self.ended() else "went on")

    def inject_engine_kill(self) -> str:
        pid, _ = self._an_engine()
        os.kill(pid, signal.SIGKILL)
        took = self._replaced(pid, 300)
        return f"engine {pid} killed; " + (f"replaced, serving again after {took:.0f} s"
                                           if took is not None else "NOT replaced within 300 s")

    def inject_engine_stop(self) -> str:
        pid, _ = self._an_engine()
        os.kill(pid, signal.SIGSTOP)
        took = self._replaced(pid, self.args.stop_s)
        if took is not None:
            return f"engine {pid} stopped; its replica replaced after {took:.0f} s"
        if _started(pid) is not None:
            os.kill(pid, signal.SIGCONT)
            took = self._replaced(pid, 120)
            return (f"engine {pid} stopped; still there after {self.args.stop_s:.0f} s: "
                    f"SIGCONT")
        return f"engine {pid} stopped; gone, engines not all back in {self.args.stop_s:.0f} s"

    def inject_token_loop(self) -> str:
        pid, port = self._an_engine()
        set_faults(port, broken_output="token_loop")
        took = self._replaced(pid, self.args.loop_s)
        if took is not None:
            return f"engine {pid} looping; its replica drained, engine replaced after {took:.0f} s"
        try:
            set_faults(port, broken_output="")
        except OSError:
            pass
        return f"engine {pid} looping; NOT drained in {self.args.loop_s:.0f} s: cleared"

    def inject_s3_throttle(self) -> str:
        before = self.throttle.total_throttled()
        self.throttle.error_share = self.args.throttle_share
        time.sleep(self.args.throttle_s)  # the fault's own length, not a wait on a condition
        self.throttle.error_share = 0.0
        n = self.throttle.total_throttled() - before
        return f"{n} requests answered 503/500; session " + (
            "ENDED" if self.ended() else "went on")

    def inject_s3_outage(self) -> str:
        refused = self.flaky.refused
        self.flaky.outage()
        time.sleep(self.args.outage_s)  # the fault's own length
        self.flaky.restore()
        return (f"{self.flaky.refused - refused} connections refused; session "
                + ("ENDED" if self.ended() else "went on"))

    def inject_driver_kill(self) -> str:
        with self.lock:
            self.end_cause = "driver_kill"
            driver = self.driver
        t0 = time.time()
        driver.send_signal(signal.SIGKILL)
        return f"driver {driver.pid} killed; " + self._resumed(t0)

    def inject_head_restart(self) -> str:
        with self.lock:
            self.may_start.clear()
            self.end_cause = "head_restart"
            driver = self.driver
        t0 = time.time()
        try:
            self.cluster.stop()
            hung = not wait_for(lambda: driver.returncode is not None, 120)
            if hung:
                driver.send_signal(signal.SIGKILL)
                wait_for(lambda: driver.returncode is not None, 30)
            self.cluster.start()
        finally:  # a head that does not come back: the reruns fail and are counted
            self.may_start.set()
        up = time.time() - t0
        return (f"head down and up again in {up:.0f} s; driver "
                + ("hung, killed after 120 s" if hung else "ended") + "; " + self._resumed(t0))


def _interrupt(*_) -> None:
    raise KeyboardInterrupt  # SIGTERM: as Ctrl-C, the checks and the table still come


class _Polled:
    """What bench.chaos.Killer polls: ended() as a Popen's poll()."""

    def __init__(self, ended: Callable[[], bool]):
        self._ended = ended

    def poll(self) -> Optional[int]:
        return 0 if self._ended() else None


# --- the end checks ------------------------------------------------------------------------

def end_checks(store, keys: Sequence[str]) -> dict[str, Any]:
    """Read every part of the run as it is (no quarantine: a part that does not read is
    named) and count what a sound run has none of."""
    import collections

    import pandas as pd

    from jobs.io.run_index import latest_rows
    seen: collections.Counter = collections.Counter()
    frames, unreadable, rejected, failed = [], [], set(), set()
    for kind in ("data", "rejects", "failures"):
        columns = {"data": ["key", "version", "integrity_flags"], "rejects": None,
                   "failures": ["key"]}[kind]
        for path in store.part_paths(kind):
            try:
                table = store.load_part(path, kind, columns)
            except Exception as exc:  # noqa: BLE001 - named below
                unreadable.append(f"{path}: {type(exc).__name__}: {exc}"[:300])
                continue
            if kind == "data":
                frames.append(table.to_pandas())
            elif "key" in table.column_names:
                (rejected if kind == "rejects" else failed).update(
                    k for k in table.column("key").to_pylist() if k)
    data = pd.concat(frames) if frames else pd.DataFrame(columns=["key", "version",
                                                                   "integrity_flags"])
    seen.update(zip(data["key"], data["version"]))
    latest = latest_rows(data)
    expected, done = set(keys), set(data["key"])
    flagged = latest[[len(f) > 0 for f in latest["integrity_flags"]]]
    return {
        "keys": len(expected), "rows": len(data), "latest_rows": len(latest),
        "versions_above_0": int((latest["version"] > 0).sum()),
        # no row: open failures among them (a fault's rows that failed for good)
        "lost": sorted(expected - done - rejected),
        "open_failures": sorted((expected - done) & failed),
        "not_generated": sorted((expected - done) & rejected),  # rejected (context, invalid)
        "unexpected": sorted(done - expected),
        "duplicated": sorted(f"{k}#{v}" for (k, v), n in seen.items() if n > 1),
        "flagged_latest": sorted(flagged["key"]),
        "unreadable": unreadable,
        "quarantined": len(store.part_paths("quarantine/data")),
    }


def engines_left(seen: dict[int, Optional[str]]) -> list[int]:
    """The engines the soak saw that still run (same pid, same start time)."""
    return sorted(pid for pid, started in seen.items()
                  if started is not None and _started(pid) == started)


# --- the report ---------------------------------------------------------------------------

def _fmt(x: Optional[float], digits: int = 0) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def table(faults: Sequence[Fault], t0: float, args: argparse.Namespace) -> str:
    what = {n: w.format(kills=args.kills, share=args.throttle_share,
                        throttle=args.throttle_s, outage=args.outage_s)
            for n, w in WHAT.items()}
    lines = ["| # | at s | fault | window s | rows/s before | rows in window | wall cost s "
             "| idle engine-s (above the rate before) | outcome |",
             "|---|---|---|---|---|---|---|---|---|"]
    for i, f in enumerate(faults, 1):
        c = f.cost
        when = _fmt(f.started - t0) if f.started is not None else "-"
        lines.append(
            f"| {i} | {when} | {what[f.name]} | {_fmt(c.get('window_s'))} | "
            f"{_fmt(c.get('rate_before'), 1)} | {_fmt(c.get('rows'))} | "
            f"{_fmt(c.get('wall_cost_s'))} | {_fmt(c.get('idle_engine_s'))} "
            f"({_fmt(c.get('idle_cost_engine_s'))}) | {f.outcome} |")
    return "\n".join(lines)


def checks_of(report: dict[str, Any], left_running: list[int], left_after: list[int],
              faults: Sequence[Fault], attempts: Sequence[dict], succeeded: bool,
              interrupted: bool = False) -> list[tuple[str, bool, str]]:
    unplanned = [a for a in attempts if a["ended_by"] == "unplanned"]
    not_injected = [f.name for f in faults if f.started is None]
    return [
        ("the command exited 0", succeeded,
         f"{len(attempts)} driver attempts" + ("; the soak was interrupted" if interrupted
                                               else "")),
        ("every key exactly once at its latest version",
         not (report["lost"] or report["unexpected"] or report["duplicated"])
         and report["latest_rows"] + len(report["not_generated"]) == report["keys"],
         f"{report['keys']} keys, {report['latest_rows']} latest rows, {report['rows']} rows, "
         f"{len(report['lost'])} lost, {len(report['duplicated'])} duplicated, "
         f"{len(report['unexpected'])} unexpected, {len(report['not_generated'])} rejected, "
         f"{len(report['open_failures'])} open failures (of the lost), "
         f"{report['versions_above_0']} latest at version > 0"),
        ("no flagged latest row", not report["flagged_latest"],
         f"{len(report['flagged_latest'])} {report['flagged_latest'][:5]}"),
        ("no unreadable part", not report["unreadable"],
         f"{len(report['unreadable'])} {report['unreadable'][:3]}; "
         f"{report['quarantined']} quarantined data parts"),
        ("no engine process left", not left_running and not left_after,
         f"outliving their replicas: {left_running}; after the cluster stopped: {left_after}"),
        ("every fault injected", not not_injected, ", ".join(not_injected) or "all"),
        ("no session ended but by the driver kill and the head restart", not unplanned,
         f"{len(unplanned)} unplanned: " + ", ".join(f"attempt {a['attempt']} exit "
                                                    f"{a['exit_code']}" for a in unplanned)),
    ]


# --- main ---------------------------------------------------------------------------------

def soak_config(args: argparse.Namespace, input_uri: str, run_name: str, endpoint: str
                ) -> dict[str, Any]:
    """jobs/configs/demo-sim.yaml, its input, output, app and S3 endpoint the soak's."""
    import yaml
    tree = yaml.safe_load(DEMO_CONFIG.read_text())
    tree["job"].update(input=input_uri, output=f"s3://{BUCKET}/runs", run_name=run_name)
    tree["serve"]["app_name"] = APP
    tree["engine"]["simulator"]["time_scale"] = args.time_scale
    tree["storage"]["endpoint_url"] = endpoint
    for item in args.set:
        dotted, value = item.split("=", 1)
        *path, last = dotted.split(".")
        node = tree
        for part in path:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(value)
    return tree


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=20000)
    p.add_argument("--faults", default=",".join(FAULTS),
                   help=f"comma-separated, in order (default: {','.join(FAULTS)})")
    p.add_argument("--first", type=float, default=60, help="s after the first durable rows")
    p.add_argument("--spacing", type=float, default=120, help="s between faults")
    p.add_argument("--settle-s", type=float, default=60,
                   help="a fault starts no sooner than this after the last one was over")
    p.add_argument("--baseline-s", type=float, default=60,
                   help="the window before a fault its costs are measured against")
    p.add_argument("--time-scale", type=float, default=0.4,
                   help="the simulator's wall s per simulated s (demo-sim.yaml: 0.05)")
    p.add_argument("--kills", type=int, default=4, help="Ray workers killed by worker_kills")
    p.add_argument("--stop-s", type=float, default=180, help="SIGCONT after this, if not replaced")
    p.add_argument("--loop-s", type=float, default=180, help="loop cleared after this, if not drained")
    p.add_argument("--throttle-s", type=float, default=60)
    p.add_argument("--throttle-share", type=float, default=0.2)
    p.add_argument("--outage-s", type=float, default=30)
    p.add_argument("--sample-s", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-attempts", type=int, default=8)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override the run's config (dotted key, YAML value)")
    p.add_argument("--work-dir", default=str(REPO / ".local" / "soak"))
    args = p.parse_args(argv)
    args.fault_names = [f for f in args.faults.split(",") if f]
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    try:
        faults = schedule(args.fault_names, args.first, args.spacing)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import yaml

    from bench.prompts import prompt_file
    from bench.s3_faults import FlakyProxy, ThrottlingS3Proxy
    from cluster.local_stack import create_bucket, set_local_aws_env, start_s3
    from jobs.config import StorageConfig
    from jobs.io.run_store import RunStore
    from jobs.io.storage import locate, write_bytes_atomic
    from jobs.pipeline.validate import parse_row
    from serve_apps.engine_process import free_port

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    set_local_aws_env()
    run_name = f"soak-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    port = free_port()
    s3 = start_s3(port, log_dir=work)
    throttle = flaky = cluster = soak = None
    succeeded, report, interrupted = False, None, False
    left_running: list[int] = []
    left_after: list[int] = []
    try:
        direct = f"http://127.0.0.1:{port}"
        create_bucket(BUCKET, port)
        throttle = ThrottlingS3Proxy(port, error_share=0.0, seed=args.seed)
        flaky = FlakyProxy(throttle.port)  # the run -> outage -> throttling -> moto
        prompts = prompt_file(work, args.prompts)
        input_uri = f"s3://{BUCKET}/prompts/{prompts.name}"
        write_bytes_atomic(locate(input_uri, StorageConfig(endpoint_url=direct)),
                           prompts.read_bytes())
        keys = [parse_row(line)["key"] for line in prompts.read_text().splitlines() if line]
        tree = soak_config(args, input_uri, run_name, flaky.endpoint)
        cfg_path = work / f"{run_name}.yaml"
        cfg_path.write_text(yaml.safe_dump(tree))
        slots = tree["serve"]["autoscaling"]["max_replicas"]
        store = RunStore.for_run(tree["job"]["output"], run_name,
                                 StorageConfig(**{**tree["storage"], "endpoint_url": direct}))
        cluster = OwnCluster()
        soak = Soak(args, cluster, store, cfg_path, throttle, flaky, slots)
        print(f"[soak] run {run_name}: {args.prompts} prompts, faults "
              f"{','.join(args.fault_names)}; S3 {direct} (the run's: {flaky.endpoint}); "
              f"Ray {cluster.temp_dir}; config {cfg_path}", flush=True)
        sampler = threading.Thread(target=soak.sample_loop, daemon=True, name="soak-samples")
        injector = threading.Thread(target=soak.faults_loop, args=(faults,), daemon=True,
                                    name="soak-faults")
        t_start = time.time()
        cluster.start()
        sampler.start()
        injector.start()
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            succeeded = soak.drive(args.max_attempts)
        except KeyboardInterrupt:  # the soak stopped early: what the run holds is checked
            interrupted = True
            print("[soak] interrupted: driver stopped; checking what the run holds", flush=True)
            if soak.driver is not None and soak.driver.returncode is None:
                soak.driver.kill()
                soak.driver.wait(timeout=60)
        run_end = time.time()
        soak.done.set()
        injector.join(timeout=600)
        sampler.join(timeout=60)
        throttle.error_share = 0.0
        flaky.restore()
        report = end_checks(store, keys)
        # the engines still running belong to the app's current replicas, no more
        current = set(cluster.engines())
        left_running = [p for p in engines_left(soak.engines_seen) if p not in current]
        if len(current) > slots:
            left_running += sorted(current)
    finally:
        if soak is not None:
            soak.done.set()
            if soak.driver is not None and soak.driver.returncode is None:
                soak.driver.kill()  # the soak itself failed: its driver goes with it
        if cluster is not None:
            cluster.stop()
            shutil.rmtree(cluster.temp_dir, ignore_errors=True)
        if soak is not None:
            wait_for(lambda: not engines_left(soak.engines_seen), 30)
            left_after = engines_left(soak.engines_seen)
        for proxy in (flaky, throttle):
            if proxy is not None:
                proxy.close()
        if s3 is not None:
            s3.terminate()
    t0 = soak.first_rows_at or t_start
    for fault, start, end in windows(faults, args.spacing, args.settle_s, run_end):
        fault.cost = window_cost(soak.samples, start, end, args.baseline_s)
    checks = checks_of(report, left_running, left_after, faults, soak.attempts, succeeded,
                       interrupted)
    rate = (soak.completed() / (run_end - t0)) if run_end > t0 else 0
    lines = [f"`python -m bench.soak {' '.join(argv if argv is not None else sys.argv[1:])}`",
             "",
             f"run {run_name}: {args.prompts} prompts, {len(report['duplicated'])} duplicated; "
             f"wall {run_end - t_start:.0f} s (first durable rows after "
             f"{t0 - t_start:.0f} s, then {run_end - t0:.0f} s, {rate:.1f} rows/s overall); "
             f"{len(soak.attempts)} driver attempts "
             f"({', '.join(a['ended_by'] for a in soak.attempts)}); "
             f"{throttle.total_throttled()} S3 requests throttled; "
             f"{soak.samples[-1].idle_engine_s if soak.samples else 0:.0f} idle engine-s in all",
             "", table(faults, t0, args), "",
             *(f"- {'PASS' if ok else 'FAIL'} {name}: {detail}" for name, ok, detail in checks)]
    text = "\n".join(lines)
    print(text, flush=True)
    (work / f"{run_name}.md").write_text(text + "\n")
    (work / f"{run_name}.json").write_text(json.dumps({
        "faults": [asdict(f) for f in faults], "attempts": soak.attempts,
        "samples": [asdict(s) for s in soak.samples], "checks": checks,
        "report": {k: (v[:50] if isinstance(v, list) else v) for k, v in report.items()},
    }, indent=1, default=str))
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
