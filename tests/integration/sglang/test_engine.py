"""What SGLang's real engine does below raygen's client: its radix cache, its uvicorn's
keep-alive, and what raygen's client reads from it (the pool's engines, called directly)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from serve_apps.engine_client import KEEPALIVE_S, EngineClient
from tests.integration.helpers import replica_infos
from tests.support import sglang_cpu

pytestmark = [pytest.mark.integration]


def _generate(url: str, ids: list[int], sampling: dict, rid: str):
    async def call():
        client = EngineClient(url, request_timeout_s=60)
        try:
            return await client.generate(ids, sampling, rid)
        finally:
            await client.close()
    return asyncio.run(call())


def test_radix_cache_serves_a_repeated_prompt_but_its_last_token(sglang_pool):
    url = sglang_pool.urls[0]
    ids = sglang_cpu.chat_ids(f"a prompt no other test sends: {uuid.uuid4().hex}")
    first = _generate(url, ids, {"max_new_tokens": 8, "temperature": 0}, "cache-1")
    again = _generate(url, ids, {"max_new_tokens": 8, "temperature": 0}, "cache-2")
    # The first time only the template's opening tokens can be cached (other prompts'
    # "<|im_start|>user\n..."), never the unique tail.
    assert first.cached_tokens < len(ids) - 30
    assert again.cached_tokens == len(ids) - 1  # SGLang recomputes the last prompt token
    assert again.output_ids == first.output_ids == sglang_cpu.OUTPUT_IDS[:8]


def test_client_survives_uvicorn_closing_idle_connections(sglang_pool):
    """SGLang's uvicorn closes a connection idle for 5 s; the pool must never send on it.
    One client per idle gap, side by side."""
    url = sglang_pool.urls[1]

    async def call_idle_call(gap_s: float):
        client = EngineClient(url, request_timeout_s=60)
        ids = sglang_cpu.chat_ids("keep-alive")
        try:
            first = await client.generate(ids, {"max_new_tokens": 4}, f"ka-{gap_s}-1")
            await asyncio.sleep(gap_s)  # longer than the server keeps an idle connection
            return first, await client.generate(ids, {"max_new_tokens": 4}, f"ka-{gap_s}-2")
        finally:
            await client.close()

    async def run():
        return await asyncio.gather(*(call_idle_call(gap_s) for gap_s in (4.5, 5.2, 6.0)))
    outs = [out for pair in asyncio.run(run()) for out in pair]
    assert [o.finish_reason for o in outs] == ["length"] * 6
    assert KEEPALIVE_S < 5.0


def test_the_engines_own_log_reaches_the_replica_log(sglang_pool):
    """SGLang's output, relayed line by line by the replica, lands in the replica's log
    file (what the Ray dashboard's Serve tab shows): its start-up banner for each engine."""
    import ray
    logs = Path(ray._private.worker.global_worker.node.get_session_dir_path()) / "logs" / "serve"
    assert len(sglang_pool.urls) == 2
    replica_logs = [p.read_text(errors="replace")
                    for p in logs.glob(f"replica_{sglang_cpu.APP}_*.log")]
    assert sum("The server is fired up and ready to roll!" in text for text in replica_logs) >= 2
    assert any("sglang.launch_server" in text for text in replica_logs)  # the launch line


def test_the_canary_runs_on_the_real_engines_and_their_greedy_outputs_agree(sglang_pool):
    """Each replica sends the canary to its SGLang engine when it starts: SGLang accepts
    its requests (a 400 would leave no digest) and two sound engines agree, so neither is
    in a minority (serve_apps/canary.py)."""
    infos = replica_infos(sglang_cpu.APP, 2, 120, where=lambda i: i["canary_digest"])
    assert len({i["canary_digest"] for i in infos.values()}) == 1, infos
    assert not any(i["drained"] for i in infos.values())


def test_the_replicas_start_check_reads_what_the_real_engine_resolved(sglang_pool):
    """The pool's replicas started (their check passed); here the same check on each real
    engine's /server_info, against the pool's plan and against plans it does not hold: the
    fields raygen compares are the ones SGLang reports, under the names it reports them."""
    from contract.config import parse_engine_config
    from serve_apps.engine_resolution import mismatches
    section = sglang_cpu.engine_section(sglang_pool.model)
    plan = parse_engine_config(section)
    infos = replica_infos(sglang_cpu.APP, 2, 120)
    for info in infos.values():
        server = info["server_info"]
        assert mismatches(plan, server) == [], server
        more = parse_engine_config({**section, "max_running_requests": 17})
        (line,) = mismatches(more, server)
        assert line.startswith("engine.max_running_requests: the job plans 17") and \
            "at most 16" in line
        longer = parse_engine_config({**section, "context_length": sglang_cpu.CONTEXT * 2})
        (line,) = mismatches(longer, server)
        assert line.startswith(f"engine.context_length: the job plans prompts and budgets "
                               f"for {sglang_cpu.CONTEXT * 2} tokens, the engine resolved "
                               f"{sglang_cpu.CONTEXT}")
        speculative = parse_engine_config({**section, "speculative": {
            **sglang_cpu.SPECULATIVE, "draft_model_path": sglang_pool.model}})
        assert mismatches(speculative, server) == [
            "engine.speculative: the job plans STANDALONE (as SGLang resolves the config), "
            "the engine runs None"]
