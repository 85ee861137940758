"""The real engine: ``python -m sglang.launch_server`` built from SGLangEngineConfig.

Kept thin on purpose: this module only turns config into argv and the engine's extra
environment. Everything after the HTTP call is shared with the simulator
(serve_apps/engine_client.py). tests/contract/sglang/test_sglang_contract.py parses every
command this can build with SGLang 0.5.23's own argument parser, so a renamed flag
fails CI; tests/integration/sglang/ runs the CPU ones for real.
"""

from __future__ import annotations

import sys

from contract import spec_resolution
from contract.config import SGLangEngineConfig, SpeculativeConfig, extra_arg_flag
from serve_apps.engines import sglang_cpu

# SGLang's CPU engine: SDPA attention (also its own fallback without AMX,
# srt/arg_groups/overrides.py), no CUDA graphs (the non-deprecated spelling of
# --disable-cuda-graph), and a scheduler that sleeps while idle: by default it polls
# for requests in a busy loop, and on a CPU it shares the cores with raygen (measured:
# ~90% of a core per idle engine without it, 0 with it).
CPU_FLAGS = ["--device", "cpu", "--attention-backend", "torch_native",
             "--cuda-graph-backend-decode", "disabled",
             "--cuda-graph-backend-prefill", "disabled", "--sleep-on-idle"]


def build_command(cfg: SGLangEngineConfig, host: str, port: int,
                  python: str = sys.executable) -> list[str]:
    args: list[str] = [
        python, "-m", "sglang.launch_server",
        "--model-path", cfg.model_path,
        "--host", host, "--port", str(port),
        # No --nccl-port: SGLang picks its own when it binds it (a port chosen here could
        # be taken during the minutes of weight loading before that).
        # Ray sets CUDA_VISIBLE_DEVICES to the replica's one GPU: it is GPU 0 here.
        "--base-gpu-id", "0", "--tp-size", "1",
        "--context-length", str(cfg.context_length),
        # Always explicit: with speculative decoding SGLang silently picks 48 otherwise.
        "--max-running-requests", str(cfg.max_running_requests),
        # No uvicorn access line per request and per /health or /metrics poll (the
        # replica polls both every few seconds); SGLang's own log stays at info.
        "--log-level-http", "warning",
    ]
    if cfg.device == "cpu":
        args += CPU_FLAGS
    if cfg.max_total_tokens is not None:
        args += ["--max-total-tokens", str(cfg.max_total_tokens)]
    if cfg.served_model_name:
        args += ["--served-model-name", cfg.served_model_name]
    if cfg.mem_fraction_static is not None:
        args += ["--mem-fraction-static", str(cfg.mem_fraction_static)]
    if cfg.max_mamba_cache_size is not None:
        args += ["--max-mamba-cache-size", str(cfg.max_mamba_cache_size)]
    if cfg.reasoning_parser:
        args += ["--reasoning-parser", cfg.reasoning_parser]
    if cfg.tool_call_parser:
        args += ["--tool-call-parser", cfg.tool_call_parser]
    if cfg.speculative is not None:
        args += _speculative_args(cfg.speculative)
    if cfg.enable_metrics:
        args.append("--enable-metrics")
    # Last, after raygen's own flags; the config refuses any that would override them
    # (contract.config.RESERVED_FLAGS), so order does not decide what the engine runs.
    for name, value in cfg.extra_args.items():
        if value is False:
            continue
        args.append(extra_arg_flag(name))
        if value is not True:
            args.append(str(value))
    return args


def _speculative_args(spec: SpeculativeConfig) -> list[str]:
    args = ["--speculative-algorithm", spec.algorithm]
    # DFLASH: SGLang would read a sent --speculative-num-draft-tokens as the block size
    # instead of the drafter's own, and runs 1 step of topk 1 anyway (_handle_dflash).
    if spec.algorithm not in spec_resolution.FROM_DRAFTER:
        args += ["--speculative-num-steps", str(spec.num_steps),
                 "--speculative-eagle-topk", str(spec.eagle_topk),
                 "--speculative-num-draft-tokens", str(spec.num_draft_tokens)]
    if spec.draft_model_path:
        args += ["--speculative-draft-model-path", spec.draft_model_path]
    return args


def engine_env(cfg: SGLangEngineConfig) -> dict[str, str]:
    """Variables the engine process gets on top of the replica's (CPU engines only)."""
    if cfg.device != "cpu":
        return {}
    draft = cfg.speculative.draft_model_path if cfg.speculative else None
    return sglang_cpu.engine_env(model_paths=[cfg.model_path] + ([draft] if draft else []))
