"""One class owns an engine process's whole life: start, wait ready, watch, stop.

- Launched through ``engine_guard`` in its own session on 127.0.0.1 and a free port,
  so stopping kills the whole process group and a SIGKILLed replica leaves no orphan;
  on Linux guard and engine also carry a parent-death signal (engine_guard.py).
- ``wait_ready`` polls /health with a deadline and stops waiting the moment the child
  exits, quoting its last log lines (the usual cause: OOM, bad flag, missing weights).
- The engine's stdout/stderr are relayed line by line to this process's log, and its
  argv and environment logged once, with secret-looking values masked (contract.redact:
  the replica log is on the Ray dashboard; SGLang prints its server args, api_key too).
- ``stop`` is safe to call twice.
"""

from __future__ import annotations

import collections
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Callable, Optional

from contract.outcomes import EngineStartError
from contract.redact import mask_argv, mask_env, mask_text

logger = logging.getLogger("ray.serve.engine")


def _to_replica_log_file() -> None:
    """Send the engine's output to the replica's own log file (logs/serve/replica_*.log,
    the Ray dashboard's Serve tab) and nowhere else. In a Serve replica only the
    "ray.serve" logger's handlers write that file (records of other loggers were
    dropped, the engine's output with them); its stderr handler would also stream every
    engine line to the job driver's console, 30 hours of batch logs. Outside Serve (tests,
    benchmarks) nothing changes."""
    files = [h for h in logging.getLogger("ray.serve").handlers
             if isinstance(h, logging.FileHandler)]
    if files:
        logger.propagate = False
        for handler in files:
            if handler not in logger.handlers:
                logger.addHandler(handler)

_TAIL_LINES = 80


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


# --- the engine's HTTP port ------------------------------------------------------------
# An engine binds its port minutes after we choose it (weights, graph capture). A port
# from the ephemeral range can be taken meanwhile by any outgoing connection, so it is
# chosen below that range, and the start is retried on a new port if the bind fails.
LOW_PORT = 10000
START_ATTEMPTS = 3
_ADDRESS_IN_USE = "address already in use"


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    try:
        with open(path) as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def engine_port(host: str = "127.0.0.1", rng: Optional[random.Random] = None) -> int:
    """A port that is free now and outside the OS's ephemeral range."""
    rng = rng or random.Random()
    low, high = ephemeral_range()
    candidates = ([(LOW_PORT, low - 1)] if low - 1 > LOW_PORT else []) + \
                 ([(high + 1, 65535)] if high < 65535 else [])
    if not candidates:
        return free_port(host)
    for _ in range(200):
        lo, hi = rng.choice(candidates)
        port = rng.randint(lo, hi)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        return port
    return free_port(host)


def start_engine(command_for_port: Callable[[int], list[str]], host: str, timeout_s: float,
                 name: str = "engine", pick_port: Callable[[], int] = engine_port,
                 env: Optional[dict[str, str]] = None) -> "EngineProcess":
    """Start an engine and wait until healthy; on "address already in use" try a new port.
    ``env``: variables set for the engine process on top of this one's environment."""
    for attempt in range(1, START_ATTEMPTS + 1):
        port = pick_port()
        engine = EngineProcess(command_for_port(port), host, port, name=name, env=env)
        engine.start()
        try:
            engine.wait_ready(timeout_s)
            return engine
        except EngineStartError as exc:
            engine.stop()
            if _ADDRESS_IN_USE not in str(exc).lower() or attempt == START_ATTEMPTS:
                raise
            logger.warning("%s: port %d was taken before the engine bound it; retrying on "
                           "another port (attempt %d of %d)", name, port, attempt + 1,
                           START_ATTEMPTS)
    raise AssertionError("unreachable")


class EngineProcess:
    def __init__(self, command: list[str], host: str, port: int, name: str = "engine",
                 env: Optional[dict[str, str]] = None):
        self.command, self.host, self.port, self.name = command, host, port, name
        self.env = dict(env or {})  # on top of this process's environment
        self._proc: Optional[subprocess.Popen] = None
        self._tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._relay: Optional[threading.Thread] = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        _to_replica_log_file()
        guard = [sys.executable, "-m", "serve_apps.engine_guard",
                 "--parent-pid", str(os.getpid()), "--"]
        logger.info("starting %s: %s%s", self.name, "".join(
            f"{k}={v} " for k, v in sorted(mask_env(self.env).items())),
            " ".join(mask_argv(self.command)))
        # The guard's parent-death signal fires when the thread that forked it exits
        # (engine_guard.py), so fork from a thread that outlives the guard: it relays the
        # output, then reaps the guard. (Serve 2.60 runs __init__ on its long-lived user
        # code thread; nothing promises that any caller's thread lives this long.)
        spawned: list = []
        ready = threading.Event()
        self._relay = threading.Thread(target=self._spawn_and_relay, daemon=True,
                                       args=(guard + self.command, spawned, ready),
                                       name=f"{self.name}-log")
        self._relay.start()
        ready.wait()
        if isinstance(spawned[0], BaseException):
            raise spawned[0]
        self._proc = spawned[0]

    def _spawn_and_relay(self, argv: list[str], spawned: list,
                         ready: threading.Event) -> None:
        try:
            proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, text=True, bufsize=1,
                env={**os.environ, **self.env} if self.env else None)
        except BaseException as exc:  # re-raised by start() in the caller's thread
            spawned.append(exc)
            ready.set()
            return
        spawned.append(proc)
        ready.set()
        assert proc.stdout
        for line in proc.stdout:
            line = mask_text(line.rstrip())  # the tail ends up in start errors too
            self._tail.append(line)
            logger.info("[%s] %s", self.name, line)
        while proc.poll() is None:  # output closed: stay until the guard is gone (poll,
            time.sleep(0.5)         # not wait(): wait() would hold Popen's lock throughout)

    def returncode(self) -> Optional[int]:
        return self._proc.poll() if self._proc else None

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def last_lines(self, n: int = 30) -> str:
        return "\n".join(list(self._tail)[-n:])

    def wait_ready(self, timeout_s: float, poll_s: float = 0.25) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.is_alive():
                raise EngineStartError(
                    f"{self.name} exited with code {self.returncode()} while starting. "
                    f"Last output:\n{self.last_lines()}")
            if self.health_ok(timeout_s=2.0):
                logger.info("%s ready on %s (pid %s)", self.name, self.base_url, self.pid)
                return
            time.sleep(poll_s)
        self.stop()
        raise EngineStartError(
            f"{self.name} not healthy after {timeout_s:.0f}s on {self.base_url}; raise "
            f"engine.start_timeout_s if the model is still loading. Last output:\n"
            f"{self.last_lines()}")

    def health_ok(self, timeout_s: float = 5.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=timeout_s) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def stop(self, grace_s: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        self._signal_group(proc, signal.SIGTERM)
        self._signal_group(proc, signal.SIGCONT)  # a stopped process acts on SIGTERM once resumed
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self._signal_group(proc, signal.SIGKILL)
            proc.wait(timeout=5)
        logger.info("%s stopped (pid %s)", self.name, proc.pid)

    @staticmethod
    def _signal_group(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # the guard leads the group: engine + workers
        except ProcessLookupError:
            pass
