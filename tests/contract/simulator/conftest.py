"""Real simulator processes for the simulator's contract tests, killed at session end."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest

from contract.simulator_settings import SimulatorSettings
from tests.support.simulator import SimProcess


@pytest.fixture(scope="session")
def sim_factory() -> Iterator[Callable[..., SimProcess]]:
    """start(**settings) -> a running simulator; every process is killed at session end."""
    procs: list[SimProcess] = []

    def start(require_ready: bool = True, **overrides: Any) -> SimProcess:
        proc = SimProcess(SimulatorSettings(**overrides))
        procs.append(proc)
        proc.wait_listening(require_ready)
        return proc

    yield start
    for p in procs:
        p.stop()


@pytest.fixture(scope="session")
def sim_fast(sim_factory) -> SimProcess:
    """Zero-latency simulator with default model settings, shared by the contract tests."""
    return sim_factory(time_scale=0.0)
