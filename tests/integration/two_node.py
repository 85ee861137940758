"""A two-node Ray cluster on this machine, separate from the suite's one-node cluster:
a head and a second raylet started with `ray start` as subprocesses, every port free,
its own temp dir. Node 2 can be "lost" (its raylet SIGKILLed, the machine stays up) and
the whole cluster stopped by its own PIDs (cluster.local_stack.stop_session), never by
`ray stop`, which would stop every Ray cluster on the machine."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from cluster.local_stack import descendants, session_pids, stop_session
from serve_apps.engine_process import free_port

RAY_BIN = str(Path(sys.executable).with_name("ray"))
ENGINE_MARK = b"serve_apps.engines"


def _node_ports() -> list[str]:
    return ["--node-manager-port", str(free_port()), "--object-manager-port", str(free_port()),
            "--dashboard-agent-listen-port", str(free_port()),
            "--dashboard-agent-grpc-port", str(free_port()),
            "--runtime-env-agent-port", str(free_port()),
            "--metrics-export-port", str(free_port())]


def _port_of(args: list[str], flag: str) -> int:
    return int(args[args.index(flag) + 1])


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass
class TwoNodeCluster:
    temp_dir: str
    address: str = ""
    session: str = ""
    env: dict = field(default_factory=dict)
    node2_manager_port: int = 0

    @classmethod
    def start(cls, head_cpus: int = 4, node2_cpus: int = 4, attempts: int = 2
              ) -> "TwoNodeCluster":
        """Start both nodes; on a heavily loaded machine `ray start` can miss its own
        deadlines, so a failed start is stopped and tried once more."""
        for attempt in range(attempts):
            try:
                return cls._start_once(head_cpus, node2_cpus)
            except (RuntimeError, subprocess.TimeoutExpired):
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def new(cls) -> "TwoNodeCluster":
        """Not started yet: its temp dir and the environment its `ray start`s get."""
        # Short: Ray's socket paths live under it (108-byte limit).
        cluster = cls(temp_dir=tempfile.mkdtemp(prefix="rn", dir="/tmp"))
        # Ray 2.60 turns token auth on for a new head by default; a joining node (and
        # drivers) must then say so too, reading the same local token (~/.ray/auth_token).
        cluster.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
                       "DASHBOARD_METRIC_PORT": str(free_port()),
                       "AUTOSCALER_METRIC_PORT": str(free_port()),
                       # On a loaded shared machine a raylet may take long to register.
                       "RAY_raylet_start_wait_time_s": "180",
                       # The GCS declares a node dead after 3 failed health checks 1 s
                       # apart, not 5 at 3 s (~15 s): the killed raylet refuses at once,
                       # and a check that merely waits still has its 10 s timeout.
                       "RAY_health_check_period_ms": "1000",
                       "RAY_health_check_failure_threshold": "3"}
        cluster.env.pop("RAY_ADDRESS", None)
        return cluster

    @classmethod
    def _start_once(cls, head_cpus: int, node2_cpus: int) -> "TwoNodeCluster":
        cluster = cls.new()
        gcs_port = free_port()
        common = ["--temp-dir", cluster.temp_dir, "--disable-usage-stats"]
        cluster._ray_start(["--head", "--port", str(gcs_port), "--num-cpus", str(head_cpus),
                            "--include-dashboard", "false",
                            "--ray-client-server-port", str(free_port()),
                            "--resources", json.dumps({"head": 100})]
                           + _node_ports() + common)
        cluster.address = f"127.0.0.1:{gcs_port}"
        cluster.session = Path(cluster.temp_dir, "session_latest").resolve().name
        node2 = _node_ports()
        cluster.node2_manager_port = _port_of(node2, "--node-manager-port")
        cluster._ray_start(["--address", cluster.address, "--num-cpus", str(node2_cpus),
                            "--resources", json.dumps({"node2": 100})] + node2 + common)
        return cluster

    def _ray_start(self, args: list[str]) -> None:
        try:
            out = subprocess.run([RAY_BIN, "start", *args], env=self.env, capture_output=True,
                                 text=True, timeout=300)
        except subprocess.TimeoutExpired:
            self.stop()  # what it started so far must not outlive the test
            raise
        if out.returncode != 0:
            self.stop()
            raise RuntimeError(f"ray start {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")

    def job_env(self, **extra: str) -> dict:
        return {**self.env, "RAY_ADDRESS": self.address, **extra}

    def pids(self) -> list[int]:
        """This cluster's Ray processes: each names its session dir, inside our temp dir."""
        return session_pids(self.temp_dir)

    def node2_raylet(self) -> int:
        mark = f"--node_manager_port={self.node2_manager_port}".encode()
        found = [p for p in self.pids() if b"raylet" in _cmdline(p).split(b"\0")[0]
                 and mark in _cmdline(p)]
        assert len(found) == 1, f"node 2 raylet: {found}"
        return found[0]

    def engines(self, under: list[int] | None = None) -> list[int]:
        """Engine processes of THIS cluster: below its processes (or below `under`)."""
        roots = self.pids() if under is None else under
        return [p for p in descendants(roots) if ENGINE_MARK in _cmdline(p) and alive(p)]

    def kill_node2(self) -> list[int]:
        """SIGKILL node 2's raylet (node loss, machine up); returns node 2's engines."""
        raylet = self.node2_raylet()
        engines = self.engines(under=[raylet])
        os.kill(raylet, signal.SIGKILL)
        return engines

    def stop(self) -> None:
        stop_session(self.temp_dir, grace_s=10)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def run_name() -> str:
    return f"nl-{uuid.uuid4().hex[:8]}"
