"""One replica = one engine (one GPU for SGLang): a plain class, and its Serve deployment.

``EngineReplica(cfg, backend=...)`` holds the replica's logic and knows nothing of Serve,
so a unit test builds it with an in-process fake backend (as Ray's ``LLMServer`` takes
``engine_cls``). The backend starts, watches, talks to and stops the engine; the real
one, ``ProcessBackend``, runs it as a guarded child process (engine_process.py,
engine_guard.py) and blocks until /health, bounded by ``start_timeout_s``.

The replica answers Serve's ``check_health`` from the engine (a dead engine raises, so
Serve replaces the replica; so does a drained one: output_watch.py, canary.py), relays the engine's gauges to Ray metrics, sends its engine's load with every result
(engine_load.py: the job's adaptive rows in flight follow it), and stops the
engine on shutdown. Requests: ``generate`` takes one prompt; ``generate_many`` takes a
few and streams each result back as it finishes (one handle call per chunk costs far
less control-plane CPU than one per row). ``EngineDeployment`` is the Serve wrapper:
it takes the engine config as JSON and starts the real backend.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import time
import urllib.request
from typing import Any, AsyncIterator, Callable, Optional, Protocol

from ray import serve

from contract.config import EngineConfig, SGLangEngineConfig, parse_engine_config
from contract.outcomes import EngineDead, ReplicaError
from contract.protocol import GenerateRequest, GenerateResult
from serve_apps import canary, engine_resolution, gpu_pinning
from serve_apps.chat_format import (assistant_spans, model_template_renderer,
                                    probed_assistant_spans, render_prompt)
from serve_apps.engine_client import EngineClient, effective_running_cap
from serve_apps.engine_clock import EngineClock
from serve_apps.engine_load import LoadProbe
from serve_apps.engine_process import start_engine
from serve_apps.engines import launch_command, launch_env
from serve_apps.generation import Generator
from serve_apps.output_watch import OutputWatch
from serve_apps.replica_metrics import ReplicaMetrics

logger = logging.getLogger("ray.serve")
RELAY_PERIOD_S = 5.0


def _app_name() -> str:
    try:
        return serve.get_replica_context().app_name
    except Exception:  # outside Serve (unit tests)
        return "local"


def _replica_id() -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside Serve (unit tests): a stable local name
        return f"local-{os.getpid()}"


class EngineBackend(Protocol):
    """A started engine: the client that talks to it, and its life."""

    client: EngineClient
    url: str    # where the engine listens (info, health messages)
    pid: Optional[int]

    def is_alive(self) -> bool: ...

    def exit_report(self) -> str:
        """Why the engine is gone: exit code and its last output."""
        ...

    def server_info(self) -> dict[str, Any]:
        """The engine's /server_info, read once at start (blocking)."""
        ...

    def stop(self) -> None: ...


# What EngineReplica calls to start its engine: (config, name for logs) -> a started backend.
BackendFactory = Callable[[EngineConfig, str], EngineBackend]


class ProcessBackend:
    """The engine as a child process under engine_guard on 127.0.0.1 (a free port)."""

    def __init__(self, cfg: EngineConfig, name: str):
        host = "127.0.0.1"
        if isinstance(cfg, SGLangEngineConfig) and cfg.device == "cuda":
            gpu_pinning.require_own_gpu()  # before minutes of loading onto the wrong GPU
        self.process = start_engine(lambda port: launch_command(cfg, host, port), host,
                                    cfg.start_timeout_s, name=name, env=launch_env(cfg))
        self.client = EngineClient(self.process.base_url, cfg.request_timeout_s)
        self.url, self.pid = self.process.base_url, self.process.pid

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def exit_report(self) -> str:
        return f"engine exited with code {self.process.returncode()}:\n{self.process.last_lines()}"

    def server_info(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/server_info", timeout=60) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        self.process.stop()


DRAIN_HOLD_S = 30.0


class EngineReplica:
    def __init__(self, cfg: EngineConfig, *, backend: BackendFactory = ProcessBackend,
                 canary_board: Optional[Callable[[], Any]] = None,
                 clock: Optional[Callable[..., EngineClock]] = None):
        self.cfg = cfg
        self.config_hash = cfg.config_hash()
        self.replica_id = _replica_id()
        started_at = time.time()
        self.engine = backend(cfg, f"engine[{self.replica_id}]")
        try:  # before serving a row: the job planned from the config (engine_resolution.py)
            server_info = self.engine.server_info()
            engine_resolution.check(cfg, server_info)
        except BaseException:
            self.engine.stop()
            raise
        # None: idle time not published (outside Serve); the job reads it (engine_clock.py)
        self.clock = clock(_app_name(), self.replica_id, started_at, time.time()) if clock else None
        self.client = self.engine.client
        model_template = self.cfg.chat_template == "model"
        render = model_template_renderer(self.cfg.model_path) if model_template else render_prompt
        self.generator = Generator(self.client, self.cfg.context_length,
                                   self.cfg.think_end_token, self.replica_id,
                                   engine_alive=self.engine.is_alive, render=render,
                                   reserved_tokens=self.cfg.reserved_tokens,
                                   spans=probed_assistant_spans(render) if model_template
                                   else assistant_spans)
        self.metrics = ReplicaMetrics(self.cfg.model_name)
        self.watch = OutputWatch(cfg.drain_flagged_fraction, cfg.drain_window_rows,
                                 self.replica_id,
                                 canary=bool(cfg.canary_interval_s and canary_board))
        self.canary_board = canary_board() if canary_board else None  # None: no canary
        self.canary_digest: Optional[str] = None  # of its latest canary round
        self._inflight = 0
        # Sent with every result: the job's adaptive in-flight control reads it.
        self.load = LoadProbe(self.client.metrics_text,
                              effective_running_cap(server_info) or cfg.max_running_requests,
                              self.replica_id)
        self._inflight_keys: collections.Counter = collections.Counter()  # (run, key)
        self._last_result_at: Optional[float] = None  # wall time of the last finished row
        self._relay_task: asyncio.Task | None = None
        self._canary_task: asyncio.Task | None = None

    def _ensure_relay(self) -> None:
        if self._relay_task is None:  # needs the replica's running event loop
            self._relay_task = asyncio.get_running_loop().create_task(self._relay_loop())
        if (self._canary_task is None and self.cfg.canary_interval_s
                and self.canary_board is not None):
            self._canary_task = asyncio.get_running_loop().create_task(self._canary_loop())

    async def canary_round(self) -> Optional[str]:
        """Send the canary, report its digest; drains when the board says it diverges
        twice in a row: on a GPU, greedy outputs can flip with the batch they are decoded
        in (kernels are not batch-invariant), and a busy engine's batch changes within
        seconds, while a broken engine stays broken. One flip costs a second round, not
        an engine restart and its window's rows."""
        why = None
        for _ in range(canary.CONFIRM_ROUNDS):
            began = self.watch.observed  # what an agreeing round vouches for: rows before it
            results = [await self.generator.generate(r)
                       for r in canary.requests(self.cfg.canary_max_new_tokens)]
            self.canary_digest = canary.digest(results)
            if self.canary_digest is None or self.watch.drain:
                return None
            why = await self.canary_board.report(
                f"{_app_name()}:{self.config_hash}", self.replica_id, self.canary_digest,
                canary.REPORT_TTL_INTERVALS * self.cfg.canary_interval_s)
            if not why:
                self.watch.sound(before=began)
                return None
            logger.warning("canary of replica %s differs from its fleet's (%s)",
                           self.replica_id, self.canary_digest)
        self.watch.drain_now(f"{why} ({canary.CONFIRM_ROUNDS} rounds in a row)",
                             list(self._inflight_keys), since_sound=True)
        return why

    async def _canary_loop(self) -> None:
        while not self.watch.drain:
            try:
                await self.canary_round()
            except Exception as exc:  # a dead engine fails the health check instead
                logger.warning("canary round failed: %s", exc)
            await asyncio.sleep(self.cfg.canary_interval_s)

    async def _relay_loop(self) -> None:
        while True:
            self.metrics.set_inflight(self._inflight)
            try:
                up = await self.client.healthy()
                text = await self.client.metrics_text() if up else ""
                self.metrics.relay_engine(text, up)
                if up and self.clock is not None:  # a GCS call: off the event loop
                    await asyncio.to_thread(self.clock.publish, self.metrics.engine.values)
            except Exception as exc:  # a metrics hiccup must never hurt generation
                logger.warning("engine metrics relay failed: %s", exc)
            await asyncio.sleep(RELAY_PERIOD_S)

    async def info(self) -> dict[str, Any]:
        self._ensure_relay()
        server_info = await self.client.server_info()
        return {"replica": self.replica_id, "model": self.cfg.model_name,
                "engine_config_hash": self.config_hash,
                "context_length": self.cfg.context_length, "engine_pid": self.engine.pid,
                "engine_url": self.engine.url,
                # What the engine's scheduler really runs at once, not what we asked for.
                "max_running_requests": (effective_running_cap(server_info)
                                         or self.cfg.max_running_requests),
                # What the job's watchdog reads to name a stuck stage (jobs/runs/watchdog.py).
                "inflight": self._inflight, "last_result_at": self._last_result_at,
                "drained": self.watch.drained, "canary_digest": self.canary_digest,
                "server_info": server_info}

    async def count_prompt_tokens(self, prompts: list[dict[str, Any]]) -> list[int]:
        """Prompt tokens of chat prompts ({messages, tools}, template applied), for the
        context pre-check."""
        return [len(await self.generator.chat_ids(p["messages"], p["tools"])) for p in prompts]

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self._ensure_relay()
        if self.watch.drained:
            # Held, not refused at once: a replica that fails fast looks idle to Serve's
            # router and would draw every retry until it is replaced. Held rows end when
            # Serve stops it (or after DRAIN_HOLD_S) and are retried on the others.
            await asyncio.sleep(DRAIN_HOLD_S)
            raise EngineDead(self.watch.drained)
        if not self.engine.is_alive():  # known dead: held at once, the engine not asked
            await asyncio.sleep(DRAIN_HOLD_S)
            raise EngineDead(self.engine.exit_report())
        self._inflight += 1  # exported by the relay loop: Ray ships gauges every few s anyway
        self._inflight_keys[(request.run, request.key)] += 1
        try:
            result = await self.generator.generate(request)
        except EngineDead:
            # Serve must replace this replica; until its health checks have failed three
            # times (~30 s at the 10 s default) its router still sends rows here, so they
            # are held as a drained replica's are. Refused at once, each row spent its
            # attempts in seconds: the soak's kill -9 of one engine of two failed 54% of
            # a 200-row window and the breaker ended the session (BENCHMARKS.md, the soak).
            await asyncio.sleep(DRAIN_HOLD_S)
            raise
        except Exception as exc:  # noqa: BLE001 - a bug on one row must not fail its call
            logger.exception("replica code raised on row %r", request.key)
            result = GenerateResult.failed(request.key, ReplicaError.error_class,
                                           f"{type(exc).__name__}: {exc}", self.replica_id)
        else:
            self.metrics.record(request, result)
            self.watch.observe(request.run, result, list(self._inflight_keys))
            if self.watch.drain:  # this row and every later one name the condemned rows
                result.drained = self.watch.drain.record_for(request.run)
        finally:
            self._inflight_keys[(request.run, request.key)] -= 1
            if not self._inflight_keys[(request.run, request.key)]:
                del self._inflight_keys[(request.run, request.key)]
            self._inflight -= 1
            self._last_result_at = time.time()
        result.request_id = request.request_id
        result.engine_config_hash = self.config_hash
        result.load = self.load.snapshot(self._inflight)
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
        self._ensure_relay()  # Serve calls this from the start: the canary's first round
        if self.watch.drained:
            raise EngineDead(self.watch.drained)
        if not self.engine.is_alive():
            raise EngineDead(self.engine.exit_report())
        if not await self.client.healthy():
            raise EngineDead(f"engine at {self.engine.url} fails /health")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.stop()
        if getattr(self, "clock", None) is not None:
            self.clock.close()


@serve.deployment
class EngineDeployment(EngineReplica):
    """The Serve deployment: the engine config arrives as JSON; the real backend runs it,
    the cluster's canary board judges its canary."""

    def __init__(self, engine_config: dict[str, Any]):
        super().__init__(parse_engine_config(engine_config), canary_board=canary.BoardClient,
                         clock=EngineClock)
