"""The Serve deployment: one replica = one engine process (one GPU for SGLang).

The replica starts its engine in ``__init__`` (blocking until /health, bounded by
``start_timeout_s``), answers Serve's ``check_health`` from the engine (a dead engine
raises, so Serve replaces the replica), relays the engine's gauges to Ray metrics,
and kills the engine's process group on shutdown. Requests: ``generate`` takes one
prompt; ``generate_many`` takes a few and streams each result back as it finishes
(one handle call per chunk costs far less control-plane CPU than one per row).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, AsyncIterator

from ray import serve

from contract.outcomes import EngineDead, ReplicaError
from contract.protocol import GenerateRequest, GenerateResult
from serve_apps.chat_format import model_template_renderer, render_prompt
from serve_apps.config import EngineConfig
from serve_apps.engine_client import EngineClient, effective_running_cap
from serve_apps.engine_process import start_engine
from serve_apps.engines import launch_command
from serve_apps.generation import Generator
from serve_apps.replica_metrics import ReplicaMetrics

logger = logging.getLogger("ray.serve")
RELAY_PERIOD_S = 5.0


def _replica_id() -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside Serve (unit tests): a stable local name
        return f"local-{os.getpid()}"


@serve.deployment
class EngineReplica:
    def __init__(self, engine_config: dict[str, Any]):
        self.cfg = EngineConfig.model_validate(engine_config)
        self.replica_id = _replica_id()
        host = "127.0.0.1"
        self.engine = start_engine(lambda port: launch_command(self.cfg, host, port), host,
                                   self.cfg.start_timeout_s, name=f"engine[{self.replica_id}]")
        self.client = EngineClient(self.engine.base_url, self.cfg.request_timeout_s)
        render = (model_template_renderer(self.cfg.model_path)
                  if self.cfg.chat_template == "model" else render_prompt)
        self.generator = Generator(self.client, self.cfg.context_length,
                                   self.cfg.think_end_token, self.replica_id,
                                   engine_alive=self.engine.is_alive, render=render,
                                   reserved_tokens=self.cfg.reserved_tokens)
        self.metrics = ReplicaMetrics(self.cfg.model_name)
        self._inflight = 0
        self._relay_task: asyncio.Task | None = None

    def _ensure_relay(self) -> None:
        if self._relay_task is None:  # needs the replica's running event loop
            self._relay_task = asyncio.get_running_loop().create_task(self._relay_loop())

    async def _relay_loop(self) -> None:
        while True:
            self.metrics.set_inflight(self._inflight)
            try:
                up = await self.client.healthy()
                text = await self.client.metrics_text() if up else ""
                self.metrics.relay_engine(text, up)
            except Exception as exc:  # a metrics hiccup must never hurt generation
                logger.warning("engine metrics relay failed: %s", exc)
            await asyncio.sleep(RELAY_PERIOD_S)

    async def info(self) -> dict[str, Any]:
        self._ensure_relay()
        server_info = await self.client.server_info()
        return {"replica": self.replica_id, "model": self.cfg.model_name,
                "engine_config_hash": self.cfg.config_hash(),
                "context_length": self.cfg.context_length, "engine_pid": self.engine.pid,
                "engine_url": self.engine.base_url,
                # What the engine's scheduler really runs at once, not what we asked for.
                "max_running_requests": (effective_running_cap(server_info)
                                         or self.cfg.max_running_requests),
                "server_info": server_info}

    async def count_prompt_tokens(self, prompts: list[dict[str, Any]]) -> list[int]:
        """Prompt tokens of chat prompts ({messages, tools}, template applied), for the
        context pre-check."""
        return [len(await self.generator.chat_ids(p["messages"], p["tools"])) for p in prompts]

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self._ensure_relay()
        self._inflight += 1  # exported by the relay loop: Ray ships gauges every few s anyway
        try:
            result = await self.generator.generate(request)
        except EngineDead:
            raise  # Serve must replace this replica
        except Exception as exc:  # noqa: BLE001 - a bug on one row must not fail its call
            logger.exception("replica code raised on row %r", request.key)
            return GenerateResult.failed(request.key, ReplicaError.error_class,
                                         f"{type(exc).__name__}: {exc}", self.replica_id)
        finally:
            self._inflight -= 1
        self.metrics.record(request, result)
        return result

    async def generate_many(self, requests: list[GenerateRequest]
                            ) -> AsyncIterator[GenerateResult]:
        """Stream results in completion order (callers match them by ``key``)."""
        tasks = [asyncio.ensure_future(self.generate(r)) for r in requests]
        try:
            for next_done in asyncio.as_completed(tasks):
                yield await next_done
        finally:
            for task in tasks:
                task.cancel()

    async def check_health(self) -> None:
        if not self.engine.is_alive():
            raise EngineDead(f"engine exited with code {self.engine.returncode()}:\n"
                             f"{self.engine.last_lines()}")
        if not await self.client.healthy():
            raise EngineDead(f"engine at {self.engine.base_url} fails /health")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.stop()
