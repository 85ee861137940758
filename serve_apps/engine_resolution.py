"""What the engine resolved vs what the job planned, read from its /server_info at start.

raygen plans from the engine section as SGLang resolves it (contract/spec_resolution.py,
the config's planned figures): the context budget and its speculative reserve, the rows
in flight per engine. An engine that resolved otherwise (a KV pool that holds fewer
running requests than planned, rewritten speculative flags, another context length)
would turn the plan into 400s the job does not retry or rows queued past the cap, hours
later and silently. The replica compares at start and refuses to serve, naming the
setting (serve_apps/engine_deployment.py). The engine reports:

- ``context_length``, ``speculative_algorithm``, ``speculative_num_steps``,
  ``speculative_eagle_topk``, ``speculative_num_draft_tokens``: SGLang's resolved server
  args (``ServerArgs.resolved_dict``; the simulator imitates them);
- the running-request cap its scheduler really uses
  (``internal_states[0].effective_max_running_requests_per_dp``, engine_client.py).

A field the engine does not report is not compared (None: not said).
"""

from __future__ import annotations

from typing import Any, Optional

from contract.config import EngineConfig
from serve_apps.engine_client import effective_running_cap


class EngineResolvedOtherwise(RuntimeError):
    """The engine runs settings the job did not plan for; the message names them."""


def _planned_speculative(cfg: EngineConfig) -> dict[str, Any]:
    resolved = cfg.resolved_speculative
    if resolved is None:
        return {"speculative_algorithm": None}
    planned = {"speculative_algorithm": resolved.algorithm,
               "speculative_num_steps": resolved.num_steps,
               "speculative_eagle_topk": resolved.eagle_topk}
    if resolved.num_draft_tokens is not None:  # None: the drafter's own block (DFLASH)
        planned["speculative_num_draft_tokens"] = resolved.num_draft_tokens
    return planned


def mismatches(cfg: EngineConfig, server_info: dict[str, Any]) -> list[str]:
    """One line per setting the engine resolved otherwise than the job planned."""
    found: list[str] = []
    context = server_info.get("context_length")
    if context is not None and int(context) != cfg.context_length:
        found.append(f"engine.context_length: the job plans prompts and budgets for "
                     f"{cfg.context_length} tokens, the engine resolved {context}")
    cap: Optional[int] = effective_running_cap(server_info)
    planned_cap = cfg.planned_max_running_requests
    if cap is not None and cap < planned_cap:
        found.append(f"engine.max_running_requests: the job plans {planned_cap} running "
                     f"requests an engine, the engine's scheduler runs at most {cap} (its KV "
                     f"pool, speculative decoding or Mamba cache hold no more); set "
                     f"engine.max_running_requests to {cap} or give the engine more memory")
    for field, planned in _planned_speculative(cfg).items():
        if field not in server_info:
            continue
        engine = server_info[field]
        if planned is None and engine is None:
            continue
        if (planned is None) != (engine is None) or str(engine) != str(planned):
            setting = "engine.speculative" + ("" if field == "speculative_algorithm" else
                                              "." + field.removeprefix("speculative_"))
            found.append(f"{setting}: the job plans {planned} (as SGLang resolves the "
                         f"config), the engine runs {engine}")
            if field == "speculative_algorithm":
                break  # another algorithm (or none): its numbers say nothing more
    return found


def check(cfg: EngineConfig, server_info: dict[str, Any]) -> None:
    """Raise EngineResolvedOtherwise when the engine resolved something otherwise."""
    found = mismatches(cfg, server_info)
    if found:
        raise EngineResolvedOtherwise(
            f"the engine resolved its settings otherwise than the job planned: "
            f"{'; '.join(found)}")
