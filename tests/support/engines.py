"""A real simulator engine under raygen's supervisor, and the processes it leaves."""

from __future__ import annotations

import subprocess
from dataclasses import replace

from contract.config import SimulatorEngineConfig
from contract.protocol import GenerateRequest
from serve_apps.engine_process import EngineProcess, free_port
from serve_apps.engines import launch_command


def sim_engine_process(**sim) -> EngineProcess:
    """An EngineProcess (not started) running the simulator with NEXTN and ``sim`` settings."""
    cfg = SimulatorEngineConfig(kind="simulator", context_length=8192,
                       speculative={"algorithm": "NEXTN"},
                       simulator={"time_scale": 0.001, **sim})
    port = free_port()
    return EngineProcess(launch_command(cfg, "127.0.0.1", port), "127.0.0.1",
                         port, name="engine-test")


def group_pids(pgid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def generate_request(**kw) -> GenerateRequest:
    """One generate request as the job sends it; override any field by keyword."""
    req = GenerateRequest(key="k1", run="t", category="c",
                          messages=[{"role": "user", "content": "Prove that 17 is prime."}],
                          max_new_tokens=4096, sampling={"temperature": 0.6},
                          context_policy="reject")
    return replace(req, **kw)
