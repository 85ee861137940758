"""Speculative decoding on SGLang's real engine: what only the engine decides.

The speculative pool (conftest.py ``spec_pool``) is SGLang 0.5.23's CPU engine running
STANDALONE with one draft token (topk 1: a chain of 2 verify slots), through raygen's
CPU shims (serve_apps/engines/sglang_cpu/shims/: the draft backend map entry, chain
verify on torch_native attention, the CPU ops). Its draft model guesses every thinking
token wrong and every answer token right, so SGLang's verify accepts no draft while the
scripted model thinks and most after ``</think>``: the figures below are the engine's
own counts, which raygen must carry unchanged into every row, continued rows included,
and its context guard must hold at the boundary the engine really enforces.
"""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client.parser import text_string_to_metric_families

from contract import context_budget, spec_resolution
from dashboards import metrics_catalog as mc
from tests.integration.helpers import read, replica_infos, run, write_prompts
from tests.support import sglang_cpu
from tests.support.prometheus import SD_FILE, session_dir, wait_for
from tests.support.simulator import http

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = sglang_cpu.SPEC_ROWS
C = sglang_cpu.CONTEXT
ACCEPT = "sglang:spec_accept_length"


def _meta(url: str, ids: list[int], budget: int) -> dict:
    """SGLang's meta_info for one greedy request of these ids, sent straight to the engine."""
    status, body = http(url, "/generate", {"input_ids": ids, "sampling_params": {
        "max_new_tokens": budget, "temperature": 0}}, timeout=120)
    assert status == 200, body
    return body["meta_info"]


def _latest(df):
    return df.sort_values("version").groupby("key").tail(1).set_index("key").sort_index()


def test_rows_carry_the_engines_own_verify_counts(spec_run, spec_pool):
    tree, summary = spec_run
    assert summary.status == "succeeded"
    df = read(tree, "data")
    assert len(df) == ROWS
    # The engine's own counts for the same prompts, asked all at once: it batches them as
    # it batched the run's rows (one request after another took ~30 s of decode steps).
    with ThreadPoolExecutor(len(df)) as pool:
        metas = dict(zip(df["key"], pool.map(
            lambda ids: _meta(spec_pool.url, [int(i) for i in ids], 64), df["prompt_token_ids"])))
    for row in df.itertuples():
        # every draft token is verified by the target: its greedy output, to the token
        assert list(row.output_token_ids) == sglang_cpu.OUTPUT_IDS, row.key
        meta = metas[row.key]
        assert row.spec_verify_ct == meta["spec_verify_ct"], row.key
        assert row.accept_length == pytest.approx(meta["spec_accept_length"]), row.key
        # no draft agrees while thinking (27 steps for 27 tokens after the prefill's
        # first), most after: the engine's count lies strictly between
        assert len(sglang_cpu.REASONING) < row.spec_verify_ct < row.completion_tokens - 1
    assert 1.0 < df.accept_length.min() <= df.accept_length.max() < 2.0


def _relayed(name: str, app: str) -> list[float]:
    """The values Ray's metrics agents export for a relayed SGLang sample of ``app``."""
    targets = json.loads((session_dir() / SD_FILE).read_text())
    wanted = "ray_" + mc.relay_name(name)
    values = []
    for group in targets:
        for target in group["targets"]:
            text = urllib.request.urlopen(f"http://{target}/metrics", timeout=10).read().decode()
            values += [s.value for family in text_string_to_metric_families(text)
                       for s in family.samples
                       if s.name == wanted and s.labels.get("application") == app]
    return values


def test_the_engines_accept_length_is_relayed_under_its_own_name(spec_run, spec_pool):
    _, body = http(spec_pool.url, "/metrics")
    (engine,) = [s.value for family in text_string_to_metric_families(body)
                 for s in family.samples if s.name == ACCEPT]
    # the scheduler's last decode log interval: 1 when it held thinking steps only
    assert 1.0 <= engine <= 2.0
    wait_for(f"{ACCEPT} {engine} relayed for {sglang_cpu.SPEC_APP}",
             lambda: _relayed(ACCEPT, sglang_cpu.SPEC_APP) == [engine], 60)


def test_the_engine_runs_the_speculation_and_running_cap_raygen_planned(spec_pool):
    """SGLang resets max_running_requests under speculation unless told (48); raygen tells
    it, and the replica's start check compared /server_info with the plan: read back."""
    (info,) = replica_infos(sglang_cpu.SPEC_APP, 1).values()
    server = info["server_info"]
    planned = spec_resolution.resolve(**sglang_cpu.SPECULATIVE)
    assert (server["speculative_algorithm"], server["speculative_num_steps"],
            server["speculative_eagle_topk"], server["speculative_num_draft_tokens"]) == \
        (planned.algorithm, planned.num_steps, planned.eagle_topk, planned.num_draft_tokens)
    assert info["max_running_requests"] == sglang_cpu.engine_section("m")["max_running_requests"]


# Across SGLang's input limits (test_context_guard.py has the full table without
# speculation): the longest accepted prompt (249), the first refused (250), the context.
@pytest.mark.parametrize("n_input", [100, 249, 250, 256])
def test_the_context_room_with_speculation_is_what_the_engine_honours(spec_pool, n_input):
    reserved = spec_resolution.resolve(**sglang_cpu.SPECULATIVE).reserved_tokens  # 0: STANDALONE
    room = context_budget.room(C, n_input, reserved)
    if room <= 0:
        assert sglang_cpu.engine_answer(spec_pool.url, n_input, 1)[0] == 400
        return
    assert sglang_cpu.engine_answer(spec_pool.url, n_input, room) == (200, room)
    status, length = sglang_cpu.engine_answer(spec_pool.url, n_input, room + 1)
    assert status == 400 or length == room, (status, length)


def test_continued_rows_are_token_exact_and_sum_the_engines_verify_steps(spec_config,
                                                                         spec_pool, tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", 4)
    cut = spec_config(rows, job={"max_new_tokens": 12})
    assert run(cut).progress["truncated"] == 4
    assert run(cut, continue_truncated=True, max_total_tokens=64).status == "succeeded"
    for key, row in _latest(read(cut, "data")).iterrows():
        assert list(row.output_token_ids) == sglang_cpu.OUTPUT_IDS, key
        assert list(row.budget_history) == [12, 64] and row.continuations == 1
        prompt = [int(i) for i in row.prompt_token_ids]
        first = _meta(spec_pool.url, prompt, 12)
        second = _meta(spec_pool.url, prompt + sglang_cpu.OUTPUT_IDS[:12], 52)
        assert row.spec_verify_ct == first["spec_verify_ct"] + second["spec_verify_ct"], key
        assert row.accept_length == pytest.approx(
            len(sglang_cpu.OUTPUT_IDS) / row.spec_verify_ct), key
