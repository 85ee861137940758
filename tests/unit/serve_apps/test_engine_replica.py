"""EngineReplica driven through its backend seam: no Serve, no engine process.

The fake backend answers in-process the way an engine does (token ids, EngineOutput,
typed EngineErrors); what the replica does with those answers is the real code.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Optional

import pytest

from contract.config import SimulatorEngineConfig
from serve_apps import engine_deployment as deployment
from serve_apps.canary import PROMPTS
from serve_apps.engine_client import EngineOutput
from serve_apps.engine_deployment import EngineReplica
from serve_apps.engine_resolution import EngineResolvedOtherwise
from contract.outcomes import EngineBadRequest, EngineDead, EngineUnavailable, route
from contract.protocol import GenerateRequest, GenerateResult
from tests.support.virtual_time import VirtualClock, run_virtual


class FakeClient:
    """Tokenizes by character; answers /generate from ``answer`` (an output or an error)."""

    def __init__(self) -> None:
        self.answer: Any = "fine</think>answer"
        self.up = True
        self.metrics_page = ""

    async def tokenize(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    async def detokenize(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))

    async def generate(self, ids: list[int], sampling: dict[str, Any], rid: str,
                       require_reasoning: bool = True,
                       logprobs: Optional[int] = None) -> EngineOutput:
        if isinstance(self.answer, Exception):
            raise self.answer
        out = [ord(c) for c in self.answer]
        return EngineOutput(text=self.answer, output_ids=out, finish_reason="stop",
                            matched_stop=None, finish_length=None, prompt_tokens=len(ids),
                            completion_tokens=len(out), cached_tokens=0, reasoning_tokens=4,
                            spec_verify_ct=None, e2e_latency_s=0.01)

    async def healthy(self) -> bool:
        return self.up

    async def metrics_text(self) -> str:
        return self.metrics_page

    async def server_info(self) -> dict[str, Any]:
        return {"internal_states": [{"effective_max_running_requests_per_dp": 7}]}


class FakeBackend:
    url = "fake://engine"
    pid: Optional[int] = 4242

    def __init__(self, cfg: SimulatorEngineConfig, name: str) -> None:
        self.cfg, self.name = cfg, name
        self.client = FakeClient()
        self.alive = True
        self.stopped = 0

    def is_alive(self) -> bool:
        return self.alive

    def exit_report(self) -> str:
        return "engine exited with code 1:\nCUDA error: an illegal memory access"

    def server_info(self) -> dict[str, Any]:
        return dict(START_INFO)  # what the engine resolved, read at start (nothing said)

    def stop(self) -> None:
        self.stopped += 1


START_INFO: dict[str, Any] = {}


def _replica() -> tuple[EngineReplica, FakeBackend]:
    cfg = SimulatorEngineConfig(kind="simulator", context_length=4096)
    replica = EngineReplica(cfg, backend=FakeBackend)
    assert isinstance(replica.engine, FakeBackend)
    return replica, replica.engine


def _request(key: str = "k1") -> GenerateRequest:
    return GenerateRequest(key=key, run="r", category="c",
                           messages=[{"role": "user", "content": "hi"}], max_new_tokens=64,
                           sampling={}, context_policy="reject")


def test_backend_factory_gets_the_config_and_a_named_engine():
    replica, backend = _replica()
    assert backend.cfg is replica.cfg
    assert backend.name == f"engine[{replica.replica_id}]"


def test_generate_success_returns_a_data_result():
    replica, _ = _replica()
    result = asyncio.run(replica.generate(_request()))
    assert result["key"] == "k1" and result["error_class"] is None
    assert (result["reasoning"], result["answer"]) == ("fine", "answer")
    assert result["completion_tokens"] == len("fine</think>answer")
    assert result["replica"] == replica.replica_id


def test_every_result_carries_its_engines_load_for_the_adaptive_sender():
    replica, backend = _replica()
    backend.client.metrics_page = (
        'sglang:num_running_reqs{tp_rank="0"} 5.0\nsglang:token_usage{tp_rank="0"} 0.7\n'
        'sglang:num_retracted_requests_total{pid="1"} 3.0\n')

    async def two_rows():
        first = await replica.generate(_request("k1"))
        await asyncio.sleep(0)  # the refresh the first result started
        backend.client.answer = EngineBadRequest("HTTP 400: no")  # a failed row carries it too
        return first, await replica.generate(_request("k2"))

    first, second = asyncio.run(two_rows())
    # the cap is the engine's own (server_info says nothing here: the config's)
    assert first.load["replica"] == replica.replica_id and first.load["cap"] == 48
    assert first.load["inflight"] == 0 and first.load["age_s"] is None  # nothing read yet
    assert second.error_class == "bad_request"
    assert (second.load["running"], second.load["token_usage"], second.load["retracted"]) == \
        (5.0, 0.7, 3.0)


def test_a_bad_request_comes_back_as_a_row_error():
    replica, backend = _replica()
    backend.client.answer = EngineBadRequest("HTTP 400: unknown sampling key")
    result = asyncio.run(replica.generate(_request()))
    assert result["error_class"] == "bad_request" and not route("bad_request").retryable
    assert "unknown sampling key" in result["error_message"]


def test_a_bug_on_one_row_is_a_replica_error_result_not_a_failed_call():
    replica, backend = _replica()
    backend.client.answer = KeyError("boom")
    result = asyncio.run(replica.generate(_request()))
    assert result["error_class"] == "replica_error"
    assert result["error_message"].startswith("KeyError")


class DyingClient(FakeClient):
    """The engine process dies while a row is in it: the request fails, the process is gone."""

    def __init__(self, backend: FakeBackend) -> None:
        super().__init__()
        self.backend, self.calls = backend, 0

    async def generate(self, *args: Any, **kwargs: Any) -> EngineOutput:
        self.calls += 1
        self.backend.alive = False
        raise EngineUnavailable("connection refused")


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


async def _timed(coro) -> tuple[float, BaseException]:
    began = asyncio.get_running_loop().time()
    try:
        await coro
    except BaseException as exc:  # noqa: BLE001 - the test reads what it raised
        return asyncio.get_running_loop().time() - began, exc
    raise AssertionError("expected EngineDead")


def test_engine_death_holds_the_row_then_raises_engine_dead(monkeypatch, clock):
    """Serve replaces the replica only after its health checks fail three times; a row
    refused at once would make the replica look idle and draw every retry meanwhile (the
    soak: one engine of two killed, 54% of a window failed, the breaker ended the run).
    The row that met the death and every later one are held, the later ones without
    asking the dead engine."""
    monkeypatch.setattr(deployment, "DRAIN_HOLD_S", 30.0)
    replica, backend = _replica()
    replica.client = replica.generator.client = DyingClient(backend)
    held, exc = run_virtual(lambda: _timed(replica.generate(_request("k1"))), clock)
    assert isinstance(exc, EngineDead) and "connection refused" in str(exc)
    assert held == pytest.approx(30.0)
    held, exc = run_virtual(lambda: _timed(replica.generate(_request("k2"))), clock)
    assert isinstance(exc, EngineDead) and "illegal memory access" in str(exc)
    assert held == pytest.approx(30.0) and replica.client.calls == 1


def test_an_unavailable_but_living_engine_is_a_retryable_row_error():
    replica, backend = _replica()
    backend.client.answer = EngineUnavailable("connection reset")
    result = asyncio.run(replica.generate(_request()))
    assert result["error_class"] == "engine_unavailable" and route("engine_unavailable").retryable


def test_generate_many_streams_every_result():
    replica, _ = _replica()

    async def collect() -> list[dict]:
        return [r async for r in replica.generate_many([_request("a"), _request("b")])]
    assert sorted(r["key"] for r in asyncio.run(collect())) == ["a", "b"]


def test_check_health_raises_engine_dead_with_the_exit_report():
    replica, backend = _replica()
    asyncio.run(replica.check_health())  # healthy: no exception
    backend.client.up = False
    with pytest.raises(EngineDead, match="fake://engine fails /health"):
        asyncio.run(replica.check_health())
    backend.alive = False
    with pytest.raises(EngineDead, match="illegal memory access"):
        asyncio.run(replica.check_health())


def test_info_reports_the_engine_and_its_effective_running_cap():
    replica, _ = _replica()
    info = asyncio.run(replica.info())
    assert (info["engine_pid"], info["engine_url"]) == (4242, "fake://engine")
    assert info["max_running_requests"] == 7
    assert info["engine_config_hash"] == replica.cfg.config_hash()


def test_deleting_the_replica_stops_its_engine():
    replica, backend = _replica()
    replica.__del__()
    assert backend.stopped == 1


def _draining_replica(**drain) -> EngineReplica:
    cfg = SimulatorEngineConfig(kind="simulator", context_length=4096, drain_window_rows=4,
                                **drain)
    return EngineReplica(cfg, backend=FakeBackend)


def test_a_replica_whose_outputs_are_mostly_broken_drains_itself(monkeypatch):
    replica = _draining_replica(drain_flagged_fraction=0.5)
    replica.client.answer = "thinking forever"  # stop without </think>: missing_think_end
    for i in range(3):
        asyncio.run(replica.generate(_request(f"k{i}")))
    asyncio.run(replica.check_health())  # 3 results: the window is not full yet
    asyncio.run(replica.generate(_request("k3")))
    with pytest.raises(EngineDead, match=r"drained: 4 of its last 4 outputs were flagged "
                                         r"\(missing_think_end 4;"):
        asyncio.run(replica.check_health())  # Serve replaces the replica and its engine
    monkeypatch.setattr(deployment, "DRAIN_HOLD_S", 0.01)  # held until Serve stops it
    with pytest.raises(EngineDead, match="drained"):
        asyncio.run(replica.generate(_request("k4")))  # the job retries it elsewhere


def test_sound_outputs_or_a_drain_turned_off_never_drain():
    sound = _draining_replica(drain_flagged_fraction=0.5)
    off = _draining_replica(drain_flagged_fraction=None)
    off.client.answer = "thinking forever"
    for replica in (sound, off):
        for i in range(10):
            asyncio.run(replica.generate(_request(f"k{i}")))
        asyncio.run(replica.check_health())
    assert sound.watch.drained is None and off.watch.drained is None


def test_a_minority_of_flagged_outputs_does_not_drain():
    replica = _draining_replica(drain_flagged_fraction=0.5)
    for i, answer in enumerate(["thinking forever", "ok</think>fine"] * 4):
        replica.client.answer = answer
        asyncio.run(replica.generate(_request(f"k{i}")))
    assert replica.watch.drained is None  # 2 of every 4: not more than half


def test_every_result_from_the_drain_on_names_the_rows_it_condemns():
    replica = _draining_replica(drain_flagged_fraction=0.5)
    replica.client.answer = "thinking forever"
    results = [asyncio.run(replica.generate(_request(f"k{i}"))) for i in range(4)]
    assert [r.drained for r in results[:3]] == [None] * 3
    record = results[3].drained
    assert record["replica"] == replica.replica_id and record["keys"] == ["k0", "k1", "k2", "k3"]
    assert record["reason"].startswith("drained: 4 of its last 4")


class LocalBoard:
    """The canary board in-process: the same tally the cluster's actor keeps."""

    def __init__(self) -> None:
        from serve_apps.canary import CanaryTally
        self.tally = CanaryTally()

    async def report(self, scope, replica, digest, ttl_s):
        return self.tally.report(scope, replica, digest, ttl_s)


def test_a_replica_whose_canary_differs_from_the_others_drains():
    board = LocalBoard()
    replicas = [EngineReplica(SimulatorEngineConfig(kind="simulator", context_length=4096),
                              backend=FakeBackend, canary_board=lambda: board) for _ in range(3)]
    for i, r in enumerate(replicas):
        r.replica_id = f"r{i}"  # one process here: give each its own id
    replicas[0].client.answer = "other</think>output"  # its greedy output differs
    for r in replicas + replicas[:1]:
        asyncio.run(r.canary_round())
    assert "canary outputs" in (replicas[0].watch.drained or "")
    assert "(2 rounds in a row)" in replicas[0].watch.drained
    assert [r.watch.drained for r in replicas[1:]] == [None, None]
    looped = GenerateResult(key="looped", finish_reason="length", output_token_ids=[1])
    watch = replicas[1].watch
    watch.observe("run", looped)                     # a prompt's own flagged row, then...
    client, real_generate = replicas[1].client, replicas[1].client.generate

    async def row_returned_meanwhile(*args, **kwargs):
        if "during" not in watch.since_sound.get("run", {}):  # once, in the round's first prompt
            watch.observe("run", GenerateResult(key="during", finish_reason="stop",
                                                reasoning="r", answer="a",
                                                finished_thinking=True, output_token_ids=[1]))
        return await real_generate(*args, **kwargs)
    client.generate = row_returned_meanwhile
    asyncio.run(replicas[1].canary_round())          # ...a canary that agrees: sound until it began
    assert not watch.flagged and set(watch.since_sound["run"]) == {"during"}
    with pytest.raises(EngineDead, match="canary"):
        asyncio.run(replicas[0].check_health())
    info = asyncio.run(replicas[1].info())
    assert info["drained"] is None and info["canary_digest"] == replicas[2].canary_digest


def test_a_canary_that_differs_once_is_sent_again_and_does_not_drain():
    """A greedy output that flipped with its batch (GPU kernels are not batch-invariant)
    agrees again on the immediate second round: no drain, no restart."""
    board = LocalBoard()
    replicas = [EngineReplica(SimulatorEngineConfig(kind="simulator", context_length=4096),
                              backend=FakeBackend, canary_board=lambda: board) for _ in range(3)]
    for i, r in enumerate(replicas):
        r.replica_id = f"r{i}"
        asyncio.run(r.canary_round())
    flaky = replicas[0].client
    sent = []
    real_generate = flaky.generate

    async def flips_once(ids, sampling, rid, require_reasoning=True, logprobs=None):
        sent.append(rid)
        out = await real_generate(ids, sampling, rid, require_reasoning, logprobs)
        if len(sent) == 1:  # the first canary prompt of the round comes out different
            return dataclasses.replace(out, output_ids=out.output_ids[::-1])
        return out
    flaky.generate = flips_once
    assert asyncio.run(replicas[0].canary_round()) is None
    assert len(sent) == 2 * len(PROMPTS)  # the round, then its confirmation
    assert replicas[0].watch.drained is None
    assert replicas[0].canary_digest == replicas[1].canary_digest


def test_an_engine_that_resolved_fewer_running_requests_is_stopped_before_serving(monkeypatch):
    # SGLang's scheduler may run fewer requests than --max-running-requests (its KV pool):
    # the job planned rows in flight for the config's cap, so the replica refuses.
    cfg = SimulatorEngineConfig(kind="simulator", context_length=4096, max_running_requests=32)
    monkeypatch.setitem(START_INFO, "internal_states",
                        [{"effective_max_running_requests_per_dp": 24}])
    backends: list[FakeBackend] = []

    def backend(cfg, name):
        backends.append(FakeBackend(cfg, name))
        return backends[-1]
    with pytest.raises(EngineResolvedOtherwise) as info:
        EngineReplica(cfg, backend=backend)
    assert "engine.max_running_requests: the job plans 32" in str(info.value)
    assert "runs at most 24" in str(info.value)
    assert backends[0].stopped == 1  # its engine does not outlive the refused replica


def test_an_engine_that_resolved_what_the_job_planned_starts():
    cfg = SimulatorEngineConfig(kind="simulator", context_length=4096, max_running_requests=32)
    START_INFO.update(context_length=4096, max_running_requests=32,
                      internal_states=[{"effective_max_running_requests_per_dp": 32}])
    try:
        replica = EngineReplica(cfg, backend=FakeBackend)
    finally:
        START_INFO.clear()
    assert replica.engine.stopped == 0
