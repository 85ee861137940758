"""The REAL simulator process (python -m serve_apps.engines.simulator) for contract tests.

A process starts in its own session (process group) and stop() kills the group, so a
hung child can never outlive the test run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

from serve_apps.engine_process import free_port
from serve_apps.engines.simulator.launch import build_command
from contract.simulator_settings import SimulatorSettings

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START_TIMEOUT_S = 60.0  # generous: the machine may be shared with a Ray cluster


def http(base: str, path: str, body: Any = None, *, timeout: float = 30.0, method: str | None = None) -> tuple[int, Any]:
    """(status, decoded JSON or text) for one request; HTTP errors are returned, not raised."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method or ("POST" if data is not None else "GET"))
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    text = raw.decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {sample name: value}, summed over label sets (a simulator has
    one per name; histogram buckets are keyed by their le)."""
    from prometheus_client.parser import text_string_to_metric_families
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name + (f'{{le="{sample.labels["le"]}"}}' if "le" in sample.labels else "")
            out[name] = out.get(name, 0.0) + sample.value
    return out


class SimProcess:
    def __init__(self, settings: SimulatorSettings) -> None:
        self.settings = settings
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a chatty child can never block
        self.proc = subprocess.Popen(
            build_command(settings, "127.0.0.1", self.port),
            cwd=REPO_ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started_at = time.monotonic()

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def wait_listening(self, require_ready: bool = True) -> None:
        """Poll /health until 200 (or any answer if not require_ready), failing fast if the child died."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"simulator exited with {self.proc.returncode}:\n{self.output()}")
            try:
                status, _ = http(self.base, "/health", timeout=1.0)
                if status == 200 or not require_ready:
                    return
            except OSError:
                pass
            time.sleep(0.02)
        raise TimeoutError(f"simulator not healthy after {START_TIMEOUT_S}s:\n{self.output()}")

    def call(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return http(self.base, path, body, **kw)

    def metrics(self) -> dict[str, float]:
        status, text = self.call("/metrics")
        assert status == 200
        return parse_metrics(text)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)
        self.log.close()
