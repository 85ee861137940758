"""tests/unit/conftest.py keeps this tier pure: processes and Ray clusters are refused."""

import asyncio
import multiprocessing
import os
import subprocess

import pytest
import ray

from tests.support.virtual_time import VirtualClock, run_virtual
from tests.support.waiting import wait_until


def test_subprocesses_are_refused():
    with pytest.raises(AssertionError, match="must not start a subprocess: move it to tests/contract"):
        subprocess.run(["true"])


def test_asyncio_and_multiprocessing_children_are_refused():
    async def spawn():
        await asyncio.create_subprocess_exec("true")

    with pytest.raises(AssertionError, match="must not start a subprocess"):
        asyncio.run(spawn())
    with pytest.raises(AssertionError, match="must not"):
        multiprocessing.get_context("spawn").Process(target=print).start()


def test_fork_and_system_are_refused():
    with pytest.raises(AssertionError, match="must not call os.fork"):
        os.fork()
    with pytest.raises(AssertionError, match="must not call os.system"):
        os.system("true")


def test_ray_init_is_refused():
    with pytest.raises(AssertionError, match="must not call ray.init"):
        ray.init()
    assert not ray.is_initialized()


def test_wait_until_returns_the_first_truthy_value_or_names_what_it_waited_for():
    values = iter([0, None, "ready"])
    assert wait_until(lambda: next(values), 5, "values", poll_s=0) == "ready"
    with pytest.raises(AssertionError, match="timed out after 0 s waiting for the sky to fall"):
        wait_until(lambda: False, 0, "the sky to fall")


def test_the_virtual_clock_jumps_instead_of_sleeping():
    clock = VirtualClock()

    async def nap():
        await asyncio.sleep(3600)
        return asyncio.get_running_loop().time()

    assert run_virtual(nap, clock) == clock.now == pytest.approx(3600)
    with pytest.raises(RuntimeError, match="would wait forever"):
        run_virtual(lambda: asyncio.Event().wait())
