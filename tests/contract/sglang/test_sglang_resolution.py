"""Oracle tier: what SGLang 0.5.23 resolves from raygen's launch command, vs raygen's plan.

SGLang rewrites the speculative flags while it resolves its server args
(arg_groups/speculative_hook.py: topk 1 forces num_draft_tokens = steps + 1; DFLASH runs
1 step of topk 1 and takes its block size from the drafter's config), and plans the
context reserve and the running-request cap from the result. Here the command
serve_apps/engines/sglang.py builds goes through SGLang's own ``prepare_server_args`` and
the resolution ``runtime_context.create_context`` runs (exactly what a scheduler
process does at start), and the resolved ``get_spec()``, ``get_schedule()``,
``compute_num_reserved_tokens()`` and the model's context length are compared with
contract/spec_resolution.py and the config's planned figures.

Substitutions, all because this machine has neither the models nor a GPU:
- the model (and drafter) paths point at offline folders: a Qwen3 config
  (sglang_cpu.write_fake_model) whose max_position_embeddings is the config's context
  length; for a config with ``max_mamba_cache_size`` (the B200 one) a tiny
  Qwen3_5ForConditionalGeneration, the hybrid attention/linear-attention stack SGLang
  0.5.23 serves Qwen3.5-family models with (assumed for Qwen3.6-27B: check its
  config.json); for DFLASH a drafter config with or without a block size;
- a cuda config resolves with ``--device cuda`` (what SGLang detects on the GPU node; the
  resolution reads no GPU). _handle_dflash refuses any other device;
- the Mamba extra buffer's platform check
  (``mamba_hook._platform_supports_mamba_cache_extra_buffer``, true on CUDA) answers
  true: this CPU platform has no state snapshots.
The Mamba cap itself is computed at start from the memory pool
(``KVCacheConfigurator.resolve_max_num_reqs``), which needs a GPU: the narrowest SGLang
function that decides it, ``_calculate_mamba_ratio`` (slots per request; it reads only
the resolved config), is called under the resolved context instead.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional

import pytest

from contract.config import SGLangEngineConfig, SpeculativeConfig
from contract import context_budget
from jobs.config import load_config, rows_per_replica
from serve_apps.engine_resolution import mismatches
from serve_apps.engines.sglang import build_command
from tests.contract.sglang import sglang_cpu

REPO = Path(__file__).resolve().parents[3]
# Every shipped config with a real engine (the simulator's have no SGLang command), the
# B200 one first: the one a GPU hour is spent on.
SHIPPED = sorted((p for p in (REPO / "jobs" / "configs").glob("*.yaml")
                  if load_config(str(p)).engine.kind == "sglang"),
                 key=lambda p: (p.name != "qwen36-27b-b200.yaml", p.name))


@pytest.fixture(autouse=True)
def _as_on_a_gpu_node(sglang, monkeypatch):
    from sglang.srt.arg_groups import mamba_hook

    # prepare_server_args calls logging.basicConfig(force=True), which would rip out
    # pytest's log handlers.
    monkeypatch.setattr(logging, "basicConfig", lambda **_: None)
    monkeypatch.setattr(mamba_hook, "_platform_supports_mamba_cache_extra_buffer", lambda: True)


def _model(root: Path, context_length: int, dflash_block: Optional[int] = None,
           drafter: bool = False, hybrid: bool = False) -> Path:
    out = root / (f"drafter-{dflash_block}" if drafter else f"model-{context_length}-{hybrid}")
    if out.exists():
        return out
    sglang_cpu.write_fake_model(out)
    config = json.loads((out / "config.json").read_text())
    config["max_position_embeddings"] = context_length
    if drafter:
        config["architectures"] = ["DFlashDraftModel"]
        config["dflash_config"] = {"target_layer_ids": [0], **(
            {"block_size": dflash_block} if dflash_block else {})}
    if hybrid:  # three linear-attention (Mamba-state) layers to one full-attention layer
        text = {k: v for k, v in config.items() if k != "architectures"}
        text.update(model_type="qwen3_5_text", num_hidden_layers=4,
                    layer_types=["linear_attention"] * 3 + ["full_attention"],
                    linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                    linear_num_value_heads=2, linear_conv_kernel_dim=4)
        config = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
                  "text_config": text, "tie_word_embeddings": True,
                  "vision_config": {"depth": 1, "hidden_size": 32, "num_heads": 2,
                                    "out_hidden_size": 64, "intermediate_size": 64}}
    (out / "config.json").write_text(json.dumps(config))
    return out


def _resolve(sglang, cfg: SGLangEngineConfig, root: Path, dflash_block: Optional[int] = None):
    """SGLang's resolved view of raygen's argv for ``cfg`` (model paths substituted)."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.arg_groups.overrides import model_config_of
    from sglang.srt.managers.utils import compute_num_reserved_tokens
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator

    hybrid = cfg.max_mamba_cache_size is not None
    argv = build_command(cfg, "127.0.0.1", 30000, python="python")[3:]
    argv[argv.index("--model-path") + 1] = str(_model(root, cfg.context_length, hybrid=hybrid))
    if "--speculative-draft-model-path" in argv:
        drafter = _model(root, cfg.context_length, dflash_block, drafter=True)
        argv[argv.index("--speculative-draft-model-path") + 1] = str(drafter)
    if cfg.device == "cuda":
        argv += ["--device", "cuda"]
    sa = sglang.server_args.prepare_server_args(argv)
    with rc.use_context(rc.create_context(sa, role="tokenizer")):
        spec, schedule = rc.get_spec(), rc.get_schedule()
        running = schedule.max_running_requests
        if hybrid:  # resolve_max_num_reqs: min(requested, max_mamba_cache_size // ratio)
            ratio = KVCacheConfigurator._calculate_mamba_ratio(None)  # reads no self
            running = min(running, schedule.max_mamba_cache_size // ratio)
        return {
            "algorithm": spec.speculative_algorithm,
            "steps_topk_drafts": spec.speculative_algorithm and (
                spec.speculative_num_steps, spec.speculative_eagle_topk,
                spec.speculative_num_draft_tokens),
            "reserved": compute_num_reserved_tokens(),
            "max_running_requests": running,
            "context_length": model_config_of(sa).context_len,
            # the top of the engine's /server_info (build_server_info: resolved_dict)
            "server_info": sa.resolved_dict(),
        }


def _planned(cfg: SGLangEngineConfig) -> dict:
    r = cfg.resolved_speculative
    return {"algorithm": r and r.algorithm,
            "steps_topk_drafts": r and (r.num_steps, r.eagle_topk, r.num_draft_tokens),
            "reserved": cfg.reserved_tokens,
            "max_running_requests": cfg.planned_max_running_requests,
            "context_length": cfg.context_length}


def test_the_b200_config_is_among_them():
    assert [p.name for p in SHIPPED[:1]] == ["qwen36-27b-b200.yaml"]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_config_plans_what_sglang_resolves(sglang, tmp_path, path):
    run = load_config(str(path))
    cfg = run.engine
    resolved = _resolve(sglang, cfg, tmp_path)
    # The replica's start check finds nothing on the engine SGLang would start from it.
    assert mismatches(cfg, resolved.pop("server_info")) == []
    assert _planned(cfg) == resolved
    # The longest prompt raygen admits is the one SGLang accepts with that reserve.
    assert context_budget.max_input_tokens(cfg.context_length, cfg.reserved_tokens) == \
        context_budget.max_input_tokens(resolved["context_length"], resolved["reserved"])
    # Rows in flight per engine fill SGLang's resolved batch, and Serve admits them.
    share = rows_per_replica(run.job.max_actors * run.job.inflight_rows_per_actor,
                             run.serve.autoscaling.min_replicas)
    assert resolved["max_running_requests"] <= share <= run.serve.max_ongoing_requests


DFLASH = dict(algorithm="DFLASH", draft_model_path="drafter")
COMBOS = {
    # name: (speculative section, extra_args, the drafter's block size or None)
    "nextn-3-1-8": (dict(num_steps=3, eagle_topk=1, num_draft_tokens=8), {}, None),
    "nextn-5-1-2": (dict(num_steps=5, eagle_topk=1, num_draft_tokens=2), {}, None),
    "nextn-3-1-4": ({}, {}, None),
    "eagle3-5-4-8": (dict(algorithm="EAGLE3", num_steps=5, eagle_topk=4, num_draft_tokens=8,
                          draft_model_path="d"), {}, None),
    "standalone-2-1-6": (dict(algorithm="STANDALONE", num_steps=2, eagle_topk=1,
                              num_draft_tokens=6, draft_model_path="d"), {}, None),
    "dflash-drafter-block-10": (DFLASH, {}, 10),
    "dflash-drafter-without-block": (DFLASH, {}, None),
    "dflash-block-flag-6": (DFLASH, {"speculative-dflash-block-size": 6}, 10),
    # SGLang's parser takes a unique prefix of a flag (argparse allow_abbrev)
    "dflash-block-prefix-6": (DFLASH, {"speculative-dflash-block": 6}, 10),
}


@pytest.mark.parametrize("name", list(COMBOS))
def test_speculative_combinations_resolve_as_raygen_plans(sglang, tmp_path, name):
    spec, extra, block = COMBOS[name]
    cfg = SGLangEngineConfig(kind="sglang", model_path="m", context_length=4096,
                             max_running_requests=8, speculative=SpeculativeConfig(**spec),
                             extra_args=extra)
    resolved = _resolve(sglang, cfg, tmp_path, dflash_block=block)
    assert mismatches(cfg, resolved.pop("server_info")) == []  # the replica's start check
    assert cfg.reserved_tokens == resolved["reserved"]  # the figure a 400 hangs on
    planned = _planned(cfg)
    if planned["steps_topk_drafts"][2] is None:
        # DFLASH without a block in the config: SGLang reads the drafter's (16 without one).
        assert resolved["steps_topk_drafts"][2] == (block or 16)
        planned["steps_topk_drafts"] = (*planned["steps_topk_drafts"][:2], block or 16)
    assert planned == resolved
    assert resolved["reserved"] == {"nextn-3-1-8": 4, "nextn-5-1-2": 6, "nextn-3-1-4": 4,
                                    "eagle3-5-4-8": 20}.get(name, 0)


def test_mamba_slots_per_request_are_sglangs(sglang, tmp_path):
    """raygen's MAMBA_SLOTS_PER_REQUEST is the ratio SGLang resolves for the B200 config's
    hybrid model (extra buffer under the overlap scheduler), so the config refuses the
    first cache size SGLang would cap below its running requests."""
    from pydantic import ValidationError
    from contract.config import MAMBA_SLOTS_PER_REQUEST
    from sglang.srt import runtime_context as rc
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator

    cfg = load_config(str(SHIPPED[0])).engine
    argv = build_command(cfg, "127.0.0.1", 30000, python="python")[3:]
    argv[argv.index("--model-path") + 1] = str(_model(tmp_path, cfg.context_length, hybrid=True))
    sa = sglang.server_args.prepare_server_args(argv + ["--device", "cuda"])
    with rc.use_context(rc.create_context(sa, role="tokenizer")):
        assert rc.get_exec().mamba.enable_mamba_extra_buffer
        ratio = KVCacheConfigurator._calculate_mamba_ratio(None)
    assert ratio == MAMBA_SLOTS_PER_REQUEST
    short = ratio * cfg.max_running_requests - 1  # SGLang: short // ratio running at most
    with pytest.raises(ValidationError, match=f"caps running requests at {short // ratio} <"):
        SGLangEngineConfig(**{**cfg.model_dump(), "max_mamba_cache_size": short})
