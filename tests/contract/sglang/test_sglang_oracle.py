"""Unit-oracle tier: SGLang 0.5.23's own functions vs raygen's and the simulator's rules.

Each table row is put to SGLang's code (called, not copied) and to ours:
- speculative reserve: ``managers.utils.compute_num_reserved_tokens`` for the server args
  raygen's own launch command produces, vs ``SGLangEngineConfig.reserved_tokens``;
- context accounting: ``TokenizerManager._validate_one_request`` (with that reserve),
  ``managers.utils.validate_input_length`` and ``Scheduler.init_req_max_new_tokens`` vs
  ``contract.context_budget.room`` / ``Generator.fit_budget`` (raygen) and
  ``simulator.protocol.check_context`` (messages and enforced budget);
- the reasoning split: ``ReasoningParser("qwen3").parse_non_stream`` vs
  ``chat_format.split_reasoning``.
The request-level behaviours (finish order, reasoning count, messages, error bodies)
are compared through SGLang's real HTTP stack in test_sglang_differential.py.
"""

from __future__ import annotations

import itertools
import types

import pytest

from contract import context_budget
from serve_apps.chat_format import split_reasoning
from contract.config import SGLangEngineConfig, SpeculativeConfig
from serve_apps.engines.sglang import build_command
from serve_apps.engines.simulator.protocol import GenerateRequest, RequestError, check_context
from contract.outcomes import ContextOverflow
from serve_apps.generation import MIN_USEFUL_BUDGET, Generator
from tests.contract.sglang import sglang_cpu


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory):
    return sglang_cpu.write_fake_model(tmp_path_factory.mktemp("oracle-model"))


def _server_args(sglang, cfg: SGLangEngineConfig, model_dir) -> object:
    """SGLang's resolved server args for the command raygen would launch, on CPU."""
    argv = build_command(cfg, "127.0.0.1", 30000, python="python")[3:]
    argv[argv.index("--model-path") + 1] = str(model_dir)
    if "--speculative-draft-model-path" in argv:
        argv[argv.index("--speculative-draft-model-path") + 1] = str(model_dir)
    return sglang.server_args.prepare_server_args(argv + ["--device", "cpu"])


SPECS = {
    "off": None,
    "nextn-3-1-4": SpeculativeConfig(algorithm="NEXTN", num_steps=3, eagle_topk=1,
                                     num_draft_tokens=4),
    "eagle3-5-4-8": SpeculativeConfig(algorithm="EAGLE3", num_steps=5, eagle_topk=4,
                                      num_draft_tokens=8, draft_model_path="draft"),
    "eagle-2-1-3": SpeculativeConfig(algorithm="EAGLE", num_steps=2, eagle_topk=1,
                                     num_draft_tokens=3, draft_model_path="draft"),
    "standalone-3-1-4": SpeculativeConfig(algorithm="STANDALONE", num_steps=3, eagle_topk=1,
                                          num_draft_tokens=4, draft_model_path="draft"),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_reserved_tokens_match_compute_num_reserved_tokens(sglang, fake_model, name):
    from sglang.srt import runtime_context as rc
    from sglang.srt.managers.utils import compute_num_reserved_tokens

    cfg = SGLangEngineConfig(kind="sglang", model_path="Qwen/Qwen3.6-27B", context_length=4096,
                             max_running_requests=8, speculative=SPECS[name])
    sa = _server_args(sglang, cfg, fake_model)
    with rc.use_context(rc.create_context(sa, role="tokenizer")):
        expected = compute_num_reserved_tokens()
    assert cfg.reserved_tokens == expected
    assert expected == {"off": 0, "nextn-3-1-4": 4, "eagle3-5-4-8": 20, "eagle-2-1-3": 3,
                        "standalone-3-1-4": 0}[name]


# --- context accounting -----------------------------------------------------------------

@pytest.fixture(scope="module")
def sglang_context(sglang, fake_model):
    """``accepts(context, n_input, reserved, max_new)`` -> (status, message, enforced budget)
    computed by SGLang's three checks, in the order a request meets them."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.managers.utils import validate_input_length
    from sglang.srt.server_args import PortArgs

    managers: dict[int, TokenizerManager] = {}

    def manager(context: int) -> TokenizerManager:
        if context not in managers:
            sa = sglang.server_args.prepare_server_args(
                ["--model-path", str(fake_model), "--device", "cpu",
                 "--context-length", str(context)])
            rc.publish(sa, role="tokenizer")
            managers[context] = TokenizerManager(sa, PortArgs.init_new(sa))
        return managers[context]

    def accepts(context: int, n_input: int, reserved: int, max_new: int):
        tm = manager(context)
        tm.num_reserved_tokens = reserved  # what compute_num_reserved_tokens gave at init
        ids = [263] * n_input
        obj = GenerateReqInput(input_ids=ids, sampling_params={"max_new_tokens": max_new})
        obj.normalize_batch_and_arguments()
        try:
            tm._validate_one_request(obj, ids)
        except ValueError as exc:
            return 400, str(exc), None
        max_req_len = context - 1                       # tp_worker: context - 1
        req = types.SimpleNamespace(origin_input_ids=ids, rid="r",
                                    sampling_params=types.SimpleNamespace(max_new_tokens=max_new,
                                                                        min_new_tokens=0))
        error = validate_input_length(req, max_req_len - 5, False)
        if error:
            return 400, error, None
        sched = types.SimpleNamespace(
            max_new_tokens_limit=None, max_req_len=max_req_len, max_total_num_tokens=1 << 30,
            kv_shard_widening=1, page_size=1, sliding_window_size=None,
            chunked_prefill_size=None, token_to_kv_pool_allocator=types.SimpleNamespace(
                page_size=1, max_new_tokens_for_memory=lambda i, m, **k: m))
        Scheduler.init_req_max_new_tokens(sched, req)
        return 200, None, req.sampling_params.max_new_tokens

    return accepts


CONTEXTS = (256, 1000)
RESERVES = (0, 1, 4, 20)


def _edges(context: int, reserved: int) -> list[int]:
    """Input lengths around every limit (both checks, the clamp, the reserve)."""
    return sorted({n for base in (context, context - 6, context - reserved, context - 20)
                   for n in range(base - 4, base + 2) if 0 < n <= context + 2})


def test_room_is_exactly_what_sglang_accepts_and_honours(sglang_context):
    for context, reserved in itertools.product(CONTEXTS, RESERVES):
        for n in _edges(context, reserved):
            room = context_budget.room(context, n, reserved)
            if room > 0:
                assert sglang_context(context, n, reserved, room) == (200, None, room), \
                    (context, n, reserved, room)
            over = max(room, 0) + 1
            status, _, enforced = sglang_context(context, n, reserved, over)
            assert status == 400 or enforced < over, (context, n, reserved, over)


def test_clamp_policy_never_sends_a_budget_sglang_refuses_or_cuts(sglang_context):
    for context, reserved in itertools.product(CONTEXTS, RESERVES):
        gen = Generator(client=None, context_length=context, think_end="</think>",
                        replica_id="r", engine_alive=lambda: True, reserved_tokens=reserved)
        for n in _edges(context, reserved):
            try:
                budget = gen.fit_budget(n, 10_000, "clamp")
            except ContextOverflow:
                # Rejected before sending: SGLang would refuse it or leave too little room.
                status, _, enforced = sglang_context(context, n, reserved, MIN_USEFUL_BUDGET)
                assert status == 400 or enforced < MIN_USEFUL_BUDGET, (context, n, reserved)
                continue
            assert sglang_context(context, n, reserved, budget) == (200, None, budget)


def test_simulator_context_check_matches_sglang(sglang_context):
    for context, reserved in itertools.product(CONTEXTS, (0, 4)):
        for n in _edges(context, reserved):
            for max_new in (1, 2, 10, context - n, context - n + 1):
                if max_new < 0:
                    continue
                req = GenerateRequest(input_ids=[263] * n, rid="r", max_new_tokens=max_new,
                                      min_new_tokens=0, stop=(), stop_token_ids=(),
                                      ignore_eos=True, skip_special_tokens=True,
                                      no_stop_trim=False)
                try:
                    ours = (200, None, check_context(n, req, context, reserved))
                except RequestError as exc:
                    ours = (400, str(exc), None)
                assert ours == sglang_context(context, n, reserved, max_new), \
                    (context, n, reserved, max_new)


# --- reasoning split ----------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    " the of</think>\n\n and to",             # template opened <think> (Qwen3): not in output
    "<think>\n the of</think>\n\n and to",    # model opened it itself
    "<think> the of and",                     # cut while thinking
])
def test_reasoning_split_matches_sglang_qwen3_parser(sglang, text):
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    # Thinking on (raygen's template opens <think> in the prompt): SGLang's chat path
    # builds the parser with force_reasoning, so text before </think> is reasoning.
    reasoning, answer = ReasoningParser("qwen3", force_reasoning=True).parse_non_stream(text)
    ours_reasoning, ours_answer, _ = split_reasoning(text)
    assert ours_reasoning == (reasoning or "").strip()
    assert not ours_reasoning.startswith("<think>")
    if "</think>" in text:
        assert ours_answer == (answer or "").strip()
