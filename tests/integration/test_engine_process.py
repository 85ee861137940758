"""The engine supervisor with a real simulator process: start, health, stop, no orphans,
death while starting, the guard killing the engine when its replica is SIGKILLed, and the
HTTP port: chosen outside the ephemeral range, retried when taken before the bind."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest

from contract.config import SimulatorEngineConfig
from serve_apps.engine_client import EngineClient
from serve_apps.engine_process import (EngineProcess, engine_port, ephemeral_range, free_port,
                                       start_engine)
from serve_apps.engines import launch_command
from contract.outcomes import EngineStartError, route
from contract.protocol import GenerateRequest
from serve_apps.generation import Generator
from tests.support.engines import generate_request, group_pids, sim_engine_process
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still "exists"; it is dead for our purpose.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_start_health_stop_leaves_no_process():
    engine = sim_engine_process()
    engine.start()
    engine.wait_ready(timeout_s=30)
    assert engine.health_ok()
    pgid = engine.pid
    assert len(group_pids(pgid)) >= 2  # the guard and the engine
    engine.stop()
    engine.stop()  # safe twice
    wait_until(lambda: not group_pids(pgid), 10, "the engine's process group to exit")


def test_engine_dying_while_starting_fails_fast_with_its_output():
    engine = sim_engine_process()
    engine.command = engine.command + ["--no-such-flag"]
    engine.start()
    # "exited with code", not the start_timeout_s error: it failed on the death, not the clock
    with pytest.raises(EngineStartError, match="exited with code"):
        engine.wait_ready(timeout_s=60)
    assert "no-such-flag" in engine.last_lines()


def test_engine_port_is_outside_the_ephemeral_range():
    low, high = ephemeral_range()
    rng = random.Random(7)
    ports = [engine_port(rng=rng) for _ in range(50)]
    assert all(p < low or p > high for p in ports), (low, high, ports)
    assert all(p >= 1024 for p in ports)


def test_engine_start_retries_on_a_port_taken_before_the_bind():
    """Another socket takes the chosen port before the engine binds it: the engine dies
    with "address already in use" and the start is retried on a new port."""
    cfg = SimulatorEngineConfig(kind="simulator", context_length=8192, simulator={"time_scale": 0.001})
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    ports = iter([taken, free_port()])
    try:
        engine = start_engine(lambda port: launch_command(cfg, "127.0.0.1", port), "127.0.0.1",
                              timeout_s=60, name="engine-port-test", pick_port=lambda: next(ports))
    finally:
        squatter.close()
    try:
        assert engine.port != taken and engine.health_ok()
    finally:
        engine.stop()


def test_engine_start_gives_up_after_the_last_attempt():
    cfg = SimulatorEngineConfig(kind="simulator", context_length=8192, simulator={"time_scale": 0.001})
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    try:
        with pytest.raises(EngineStartError, match="(?i)address already in use"):
            start_engine(lambda port: launch_command(cfg, "127.0.0.1", port), "127.0.0.1",
                         timeout_s=60, name="engine-port-test", pick_port=lambda: taken)
    finally:
        squatter.close()


def test_startup_timeout_names_the_setting():
    engine = sim_engine_process(startup_s=30)
    engine.start()
    with pytest.raises(EngineStartError, match="start_timeout_s"):
        engine.wait_ready(timeout_s=2)
    assert not engine.is_alive()


def test_guard_kills_engine_when_the_replica_is_sigkilled(tmp_path):
    pid_file = tmp_path / "engine.pid"
    script = textwrap.dedent(f"""
        import time
        from tests.support.engines import sim_engine_process
        e = sim_engine_process()
        e.start(); e.wait_ready(30)
        open({str(pid_file)!r}, "w").write(str(e.pid))
        time.sleep(600)
    """)
    replica = subprocess.Popen([sys.executable, "-c", script], cwd=os.getcwd())
    wait_until(pid_file.exists, 30, "the replica to start its engine")
    pgid = int(pid_file.read_text())
    assert group_pids(pgid)
    replica.send_signal(signal.SIGKILL)  # no __del__, no atexit: only the guard can act
    replica.wait()
    wait_until(lambda: not group_pids(pgid), 20, "the engine to die with its replica")


@pytest.fixture(scope="module")
def sim_engine():
    engine = sim_engine_process()
    engine.start()
    engine.wait_ready(30)
    yield engine
    engine.stop()


def _generate(engine: EngineProcess, *requests: GenerateRequest,
              context_length: int = 8192) -> list:
    """Run requests through one Generator inside one event loop (as a replica does)."""
    async def go():
        client = EngineClient(engine.base_url, 30)
        # The engine runs NEXTN 3/1/4: SGLang (and the simulator) reserve 4 tokens per request.
        gen = Generator(client, context_length, "</think>", "r0", engine.is_alive,
                        reserved_tokens=4)
        try:
            return [await gen.generate(r) for r in requests]
        finally:
            await client.close()
    return asyncio.run(go())


def test_generation_result_fields(sim_engine):
    result, again = _generate(sim_engine, generate_request(), generate_request())
    assert result["error_class"] is None
    assert result["completion_tokens"] == len(result["output_token_ids"]) > 0
    assert result["prompt_tokens"] == len(result["prompt_token_ids"])
    assert result["finish_reason"] in ("stop", "length")
    assert result["effective_max_new_tokens"] == 4096 and result["budget_clamped_by"] == ""
    assert result["accept_length"] == pytest.approx(
        result["completion_tokens"] / result["spec_verify_ct"])
    assert again["output_token_ids"] == result["output_token_ids"]  # deterministic


def test_context_guard_clamps_or_rejects(sim_engine):
    big = generate_request(max_new_tokens=8190)
    rejected, clamped = _generate(sim_engine, big, replace(big, context_policy="clamp"))
    assert rejected["error_class"] == "context_overflow"
    assert not route(rejected["error_class"]).retryable
    assert "context_length 8192 leaves room for" in rejected["error_message"]
    assert clamped["error_class"] is None
    room = 8192 - clamped["prompt_tokens"] - 4  # SGLang's speculative reserve
    assert clamped["effective_max_new_tokens"] == room < 8190
    assert clamped["budget_clamped_by"] == "context_guard"


def test_bad_sampling_key_is_a_non_retryable_row_error(sim_engine):
    (result,) = _generate(sim_engine, generate_request(sampling={"temprature": 0.6}))
    assert result["error_class"] == "bad_request"
    assert route(result["error_class"]).retryable is False
    assert "temprature" in result["error_message"]


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _wait_dead(pids: list[int], timeout_s: float = 20) -> list[int]:
    try:
        wait_until(lambda: not any(_alive(p) for p in pids), timeout_s, f"{pids} to exit")
    except AssertionError:
        pass
    return [p for p in pids if _alive(p)]


def test_engine_dies_when_its_guard_is_sigkilled():
    """Ray kills a dead worker's children (the guard) by SIGKILL: no guard code runs,
    so only the kernel's parent-death signal can take the engine down."""
    engine = sim_engine_process()
    engine.start()
    try:
        engine.wait_ready(30)
        engines = _children(engine.pid)
        assert len(engines) == 1
        os.kill(engine.pid, signal.SIGKILL)
        assert _wait_dead(engines) == [], "engine outlived its SIGKILLed guard"
    finally:
        engine.stop()


def test_replica_thread_that_started_the_engine_may_exit(tmp_path):
    """The guard's parent-death signal fires when the forking THREAD exits: a replica
    built in a short-lived thread must keep its engine; SIGKILLing the replica then
    takes guard and engine down at once."""
    pid_file = tmp_path / "engine.pid"
    script = textwrap.dedent(f"""
        import threading, time
        from tests.support.engines import sim_engine_process
        box = []
        def build():
            e = sim_engine_process(); e.start(); e.wait_ready(30); box.append(e)
        t = threading.Thread(target=build); t.start(); t.join()  # that thread is gone now
        time.sleep(1.5)  # a parent-death signal would have fired by now
        assert box[0].is_alive() and box[0].health_ok(), "engine died with its thread"
        open({str(pid_file)!r}, "w").write(str(box[0].pid))
        time.sleep(600)
    """)
    replica = subprocess.Popen([sys.executable, "-c", script], cwd=os.getcwd())
    wait_until(lambda: pid_file.exists() or replica.poll() is not None, 60,
               "the replica to start its engine")
    assert pid_file.exists(), f"replica exited with {replica.poll()}"
    guard = int(pid_file.read_text())
    pids = [guard] + _children(guard)
    assert len(pids) == 2
    replica.send_signal(signal.SIGKILL)
    replica.wait()
    assert _wait_dead(pids, timeout_s=20) == [], "guard or engine outlived the replica"


def test_an_engine_that_exits_by_itself_leaves_nothing_of_its_group(tmp_path):
    """An engine whose own worker outlives it (a loaded run left SGLang's detokenizer
    behind a server whose start was cut short): the guard returns the engine's exit code
    and takes the rest of the group down with it."""
    pid_file = tmp_path / "worker.pid"
    engine = textwrap.dedent(f"""
        import subprocess, sys
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pid_file)!r}, "w").write(str(worker.pid))
        sys.exit(3)
    """)
    guard = subprocess.Popen([sys.executable, "-m", "serve_apps.engine_guard", "--parent-pid",
                              str(os.getpid()), "--", sys.executable, "-c", engine],
                             start_new_session=True)  # as the replica starts it
    try:
        assert guard.wait(timeout=60) == 3  # the engine's own code
        worker = int(pid_file.read_text())
        assert _wait_dead([worker]) == [], "the engine's worker outlived its engine and guard"
    finally:
        if guard.poll() is None:
            guard.kill()
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
