"""Engine backends: one launch command per kind; everything after launch is shared.

``launch_command`` is the only place the kinds differ (STYLE: one path, two engines).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from serve_apps.config import EngineConfig


def launch_command(cfg: "EngineConfig", host: str, port: int) -> list[str]:
    if cfg.kind == "sglang":
        from serve_apps.engines import sglang
        return sglang.build_command(cfg, host, port)
    from serve_apps.engines.simulator import launch
    settings = cfg.simulator.model_copy(update={
        "model_name": cfg.model_name,
        "context_length": cfg.context_length,
        "max_running_requests": cfg.max_running_requests,
        "speculative_reserved_tokens": cfg.reserved_tokens,
        **({"speculative_num_draft_tokens": cfg.speculative.num_draft_tokens} if cfg.speculative else {}),
        # Speculative stats appear only when speculative decoding is on, as in SGLang.
        **({} if cfg.speculative else {"accept_length": 0.0}),
    })
    return launch.build_command(settings, host, port)
