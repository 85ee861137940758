"""Engine kinds: the one place that dispatches on ``engine.kind``.

A kind differs only in how its process is launched and what it needs from the node;
everything after launch (HTTP client, generation, supervision) is shared (STYLE: one
path, two engines).
"""

from __future__ import annotations

from typing import Any

from contract import spec_resolution
from contract.config import EngineConfig, SGLangEngineConfig
from serve_apps.engines import sglang
from serve_apps.engines.simulator import launch


def launch_command(cfg: EngineConfig, host: str, port: int) -> list[str]:
    if isinstance(cfg, SGLangEngineConfig):
        return sglang.build_command(cfg, host, port)
    settings = cfg.simulator.model_copy(update={
        "model_name": cfg.model_name,
        "context_length": cfg.context_length,
        "max_running_requests": cfg.max_running_requests,
        "speculative_reserved_tokens": cfg.reserved_tokens,
        **_simulated_speculation(cfg),
        # Speculative stats appear only when speculative decoding is on, as in SGLang.
        **({} if cfg.speculative else {"accept_length": 0.0}),
    })
    return launch.build_command(settings, host, port)


def _simulated_speculation(cfg: EngineConfig) -> dict[str, Any]:
    """The speculative settings as SGLang resolves them, which the simulator reports in
    /server_info and drafts against (DFLASH without a block size in the config: SGLang's
    default block)."""
    resolved = cfg.resolved_speculative
    if resolved is None:
        return {}
    return {"speculative_num_draft_tokens":
            resolved.num_draft_tokens or spec_resolution.DFLASH_DEFAULT_BLOCK_SIZE,
            "speculative_algorithm": resolved.algorithm,
            "speculative_num_steps": resolved.num_steps,
            "speculative_eagle_topk": resolved.eagle_topk}


def launch_env(cfg: EngineConfig) -> dict[str, str]:
    """Variables the engine process gets on top of its replica's environment."""
    if isinstance(cfg, SGLangEngineConfig):
        return sglang.engine_env(cfg)
    return {}


def default_gpus(cfg: EngineConfig) -> float:
    """GPUs a replica reserves unless serve.num_gpus_per_replica says otherwise."""
    return 1 if isinstance(cfg, SGLangEngineConfig) and cfg.device == "cuda" else 0
