"""One cap's points: the config's engine started as a replica starts it, a closed-loop
client raised through the concurrency ladder, the engine's own counters over each point.

- The engine: serve_apps/engine_process.start_engine with the config's launch command
  and environment (serve_apps/engines), checked against the config as a replica checks
  it (engine_resolution), stopped at the end (its process group: nothing left running).
- The client: ``concurrency`` workers, each sending one prompt of the sample at a time
  through serve_apps/generation.Generator (the replica's own render, tokenize, context
  guard and /generate), at the run's budget and sampling. The ladder goes up without
  draining the engine between points (a point starts where the last one left the KV
  pool, closer to a long run's steady state than an empty engine); at the end the
  workers are cancelled, which aborts their requests in the engine (SGLang and the
  simulator abort a request whose client went away).
- The figures: output tok/s from the engine's ``sglang:generation_tokens_total`` over the
  point's window (its first third settles, not measured), retractions from
  ``sglang:num_retracted_requests_total`` over the whole point, settle included (raising
  the concurrency is when the pool over-admits, and after a retraction SGLang's raised
  new-token ratio holds admission back for hundreds of steps: counted over the window
  only, a fresh-clone run's 3 s points at 16 and 32 read 0 on a pool of 7 rows),
  running / queued / token usage from its gauges scraped every ``period`` s, accept
  length from the rows finished in the window (tokens after the first, which the prefill
  makes, per verify step: as cluster/smoke_checks.accept_length counts).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

from prometheus_client.parser import text_string_to_metric_families

from contract.protocol import GenerateRequest, GenerateResult
from serve_apps import engine_resolution
from serve_apps.chat_format import model_template_renderer, render_prompt
from serve_apps.engine_client import EngineClient, effective_running_cap
from serve_apps.engine_process import start_engine
from serve_apps.engines import launch_command, launch_env
from serve_apps.generation import Generator

logger = logging.getLogger("raygen")

GEN = "sglang:generation_tokens_total"
RETRACTED = "sglang:num_retracted_requests_total"
RUNNING, QUEUED, USAGE = "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"
SETTLE_FRACTION = 1 / 3


class TuneFailed(Exception):
    """The sweep started but could not measure (the engine died, every request failed)."""


def metric_sums(text: str) -> dict[str, float]:
    """Prometheus text -> sample name -> value summed over its label sets."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


@dataclass
class Point:
    """One (cap, concurrency) point's figures over its measured window."""

    cap: int
    concurrency: int
    window_s: float
    output_tok_s: float           # the engine's, per engine
    running: float                # mean over the window's scrapes
    queued: float
    token_usage: float            # mean; the KV pool's share in use
    token_usage_max: float
    retractions: int
    rows: int                     # requests finished in the window
    failed: int                   # of them, failed (context overflow, 4xx ...)
    accept_length: Optional[float]
    first_error: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass
class Finished:
    at: float
    tokens: int
    verify: Optional[int]
    error: Optional[str]


@dataclass
class Load:
    """The closed loop: workers each send the next prompt of the sample, one at a time."""

    send: Callable[[GenerateRequest], Any]   # Generator.generate
    requests: Callable[[int], GenerateRequest]
    clock: Callable[[], float] = time.monotonic
    finished: list[Finished] = field(default_factory=list)
    workers: list[asyncio.Task] = field(default_factory=list)
    _next: Any = field(default_factory=itertools.count)

    def raise_to(self, concurrency: int) -> None:
        while len(self.workers) < concurrency:
            self.workers.append(asyncio.ensure_future(self._worker()))

    async def _worker(self) -> None:
        while True:
            result: GenerateResult = await self.send(self.requests(next(self._next)))
            error = (f"{result.error_class}: {result.error_message}"
                     if result.error_class else None)
            self.finished.append(Finished(self.clock(), int(result.completion_tokens or 0),
                                          result.spec_verify_ct, error))
            if error:
                await asyncio.sleep(0.05)  # a prompt the engine refuses: not a busy loop

    def dead_worker(self) -> Optional[BaseException]:
        for task in self.workers:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return task.exception()
        return None

    async def close(self) -> None:
        for task in self.workers:
            task.cancel()
        await asyncio.gather(*self.workers, return_exceptions=True)


def point_figures(cap: int, concurrency: int, start: tuple[float, dict], end: tuple[float, dict],
                  scrapes: list[tuple[float, dict]], finished: list[Finished],
                  raised: Optional[dict] = None) -> Point:
    """The point's figures from the scrapes that open and close its window, the gauge
    scrapes in it and the requests finished in it; ``raised``: the counters scraped as
    the concurrency was raised, before the settle (retractions count from there; None:
    from the window's start) (pure)."""
    (t0, m0), (t1, m1) = start, end
    before = m0 if raised is None else raised
    span = max(t1 - t0, 1e-9)
    inside = [m for t, m in scrapes if t0 <= t <= t1] or [m1]
    done = [f for f in finished if t0 <= f.at <= t1]
    ok = [f for f in done if f.error is None]
    spec = [f for f in ok if f.verify]
    verify = sum(f.verify for f in spec)

    def mean(name: str) -> float:
        return sum(m.get(name, 0.0) for m in inside) / len(inside)

    return Point(
        cap=cap, concurrency=concurrency, window_s=span,
        output_tok_s=max(m1.get(GEN, 0.0) - m0.get(GEN, 0.0), 0.0) / span,
        running=mean(RUNNING), queued=mean(QUEUED), token_usage=mean(USAGE),
        token_usage_max=max(m.get(USAGE, 0.0) for m in inside),
        # the counter appears at the engine's first retraction (SGLang's lazy counter)
        retractions=int(round(m1.get(RETRACTED, 0.0) - before.get(RETRACTED, 0.0))),
        rows=len(done), failed=len(done) - len(ok),
        accept_length=(sum(f.tokens - 1 for f in spec) / verify) if verify else None,
        first_error=next((f.error for f in done if f.error), None))


async def run_ladder(client, load: Load, cap: int, concurrencies: tuple[int, ...],
                     point_s: float, alive: Callable[[], bool],
                     period_s: float = 1.0, say: Callable[[str], None] = print) -> list[Point]:
    """Raise ``load`` through ``concurrencies`` on one engine; a Point each."""
    async def scrape() -> tuple[float, dict]:
        return time.monotonic(), metric_sums(await client.metrics_text())

    settle = max(SETTLE_FRACTION * point_s, period_s)
    points = []
    for concurrency in concurrencies:
        raised = (await scrape())[1]
        load.raise_to(concurrency)
        await asyncio.sleep(settle)
        start, scrapes = await scrape(), []
        ends = start[0] + point_s - settle
        while time.monotonic() < ends:
            await asyncio.sleep(min(period_s, max(ends - time.monotonic(), 0.0)))
            scrapes.append(await scrape())
            _check(load, alive)
        point = point_figures(cap, concurrency, start, scrapes[-1] if scrapes else await scrape(),
                              scrapes, load.finished, raised)
        say(f"tune: cap {cap}, concurrency {concurrency}: {point.output_tok_s:,.0f} output "
            f"tok/s, {point.running:.1f} running, {point.retractions} retracted")
        if point.rows and point.failed == point.rows and not point.output_tok_s:
            raise TuneFailed(f"every request failed at concurrency {concurrency}: "
                             f"{point.first_error}")
        points.append(point)
    return points


def _check(load: Load, alive: Callable[[], bool]) -> None:
    dead = load.dead_worker()
    if dead is not None or not alive():
        raise TuneFailed(f"the engine stopped during the sweep: {dead or 'its process exited'}")


def measure_cap(engine_cfg, cap: int, concurrencies: tuple[int, ...], point_s: float,
                requests: Callable[[int], GenerateRequest],
                say: Callable[[str], None] = print) -> tuple[list[Point], dict[str, Any]]:
    """Start the engine at ``cap`` (engine_cfg has it), sweep, stop it: (points, the
    engine's /server_info figures)."""

    host = "127.0.0.1"
    started = time.monotonic()
    say(f"tune: starting the engine at max_running_requests {cap}")
    engine = start_engine(lambda port: launch_command(engine_cfg, host, port), host,
                          engine_cfg.start_timeout_s, name=f"tune-engine[{cap}]",
                          env=launch_env(engine_cfg))
    startup_s = time.monotonic() - started

    async def drive() -> tuple[list[Point], dict[str, Any]]:
        client = EngineClient(engine.base_url, engine_cfg.request_timeout_s)
        try:
            info = await client.server_info()
            engine_resolution.check(engine_cfg, info)
            render = (model_template_renderer(engine_cfg.model_path)
                      if engine_cfg.chat_template == "model" else render_prompt)
            generator = Generator(client, engine_cfg.context_length,
                                  engine_cfg.think_end_token, f"tune-{cap}",
                                  engine_alive=engine.is_alive, render=render,
                                  reserved_tokens=engine_cfg.reserved_tokens)
            load = Load(generator.generate, requests)
            try:
                points = await run_ladder(client, load, cap, concurrencies, point_s,
                                          engine.is_alive, min(1.0, point_s / 10), say)
            finally:
                await load.close()
            figures = {"cap": cap, "startup_s": round(startup_s, 1),
                       "effective_max_running_requests": effective_running_cap(info),
                       # SGLang's resolved pool; the simulator reports its setting
                       "max_total_num_tokens": (info.get("max_total_num_tokens")
                                                or info.get("max_total_tokens")),
                       "version": info.get("version")}
            return points, figures
        finally:
            await client.close()

    try:
        return asyncio.run(drive())
    finally:
        engine.stop()
