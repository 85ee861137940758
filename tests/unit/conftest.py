"""The unit tier is pure: a test here that starts a process or joins a Ray cluster fails.

Such tests belong in tests/contract (processes) or tests/integration (Ray, S3, engines);
keeping them out is what lets this tier run anywhere, in parallel, under pytest-xdist.
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess

import pytest
import ray

# matplotlib builds its font cache on its first import on a machine, running `fc-list`
# once (a fresh CI machine has no cache). That is set-up, not the test's doing: do it
# here, before the guard below is armed, so report tests behave alike on every machine.
import matplotlib.font_manager  # noqa: F401,E402


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a unit test must not {what}: move it to tests/contract or "
                             "tests/integration")
    return refuse


@pytest.fixture(autouse=True)
def unit_tests_stay_in_process(monkeypatch):
    # fork_exec is where subprocess (its own imported name), asyncio subprocesses and
    # multiprocessing's spawn start a child; os.fork/posix_spawn/system are the other ways.
    monkeypatch.setattr(subprocess, "_fork_exec", _refuse("start a subprocess"))
    monkeypatch.setattr(_posixsubprocess, "fork_exec", _refuse("start a subprocess"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        monkeypatch.setattr(os, name, _refuse(f"call os.{name}"))
    monkeypatch.setattr(ray, "init", _refuse("call ray.init"))
