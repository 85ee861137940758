"""aiohttp application speaking SGLang's native HTTP contract.

Design decisions:
- One ``Simulator`` object owns the mutable state (settings, scheduler, prefix
  cache, fault RNG, crash counter); handlers are its methods, so tests can
  also build the app in-process with ``build_app``.
- The whole output is computed when a request arrives (model.py is fast);
  the scheduler then only decides *when* the answer may leave.
- Faults come from one seeded RNG with exactly two draws per valid request
  (error, slow), so a fault pattern is reproducible for a given request order
  and retries of a failed request can succeed.
- The crash counter counts every /generate POST (valid or not) from start or
  from the last /sim/faults update of crash_after_requests; the request that
  reaches the count never gets an answer: os._exit(1) drops every connection,
  like a GPU fault.
- Handler cancellation is on (see serve()), so a client that disconnects
  frees its batch slot, as SGLang aborts such requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import signal
import time
from typing import Any, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from serve_apps.engines.simulator import model
from serve_apps.engines.simulator import tokenizer as tk
from serve_apps.engines.simulator.metrics import RequestMetrics, build_registry
from serve_apps.engines.simulator.prefix_cache import PrefixCache
from serve_apps.engines.simulator.protocol import (
    STRICT_THINKING_NEEDED,
    ContractError,
    RequestError,
    check_context,
    contract_error_body,
    error_body,
    parse_generate,
)
from serve_apps.engines.simulator.scheduler import Scheduler
from contract.simulator_settings import FAULT_FIELDS, SimulatorSettings

VERSION = "0.5.23-sim"
MAX_BODY_BYTES = 64 * 1024 * 1024  # long input_ids lists are big JSON
SHUTDOWN_GRACE_S = 1.0


def _error(message: str, status: int) -> web.Response:
    return web.json_response(error_body(message, status), status=status)


def _request_error(e: RequestError) -> web.Response:
    body = contract_error_body(str(e)) if isinstance(e, ContractError) else error_body(str(e), e.status)
    return web.json_response(body, status=e.status)


class Simulator:
    def __init__(self, settings: SimulatorSettings) -> None:
        self.settings = settings
        self.params = model.LengthParams(
            median_tokens=settings.length_median_tokens,
            sigma=settings.length_sigma,
            prompt_coupling=settings.length_prompt_coupling,
            accept_length=settings.accept_length,
        )
        self.scheduler = Scheduler(
            max_running_requests=settings.max_running_requests,
            per_request_decode_tok_s=settings.per_request_decode_tok_s,
            max_decode_tok_s=settings.max_decode_tok_s,
            prefill_tok_s=settings.prefill_tok_s,
            time_scale=settings.time_scale,
            context_length=settings.context_length,
            max_total_tokens=settings.max_total_tokens,
            schedule_conservativeness=settings.schedule_conservativeness,
        )
        self.cache = PrefixCache(settings.context_length * settings.max_running_requests)
        self.registry = build_registry(settings.model_name, self.scheduler.stats)
        self.request_metrics = RequestMetrics(settings.model_name, self.registry)
        self.request_metrics.retracted.set_function(lambda: self.scheduler.last_retracted)
        self.rng = random.Random(settings.seed)
        self.received_for_crash = 0
        self.started_at = time.monotonic()

    def ready(self) -> bool:
        return time.monotonic() - self.started_at >= self.settings.startup_s

    # ---- /generate ------------------------------------------------------
    async def generate(self, request: web.Request) -> web.Response:
        arrival = time.monotonic()
        received_ts = time.time()
        self._count_for_crash()
        if not self.ready():
            return _error("The server is starting up; retry later.", 503)
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error("The request body is not valid JSON.", 400)
        try:
            req = parse_generate(body)
            if req.max_thinking_tokens is not None and not self.settings.enable_strict_thinking:
                # tokenizer_manager.generate_request, before the context check
                raise RequestError(STRICT_THINKING_NEEDED)
            max_new = check_context(
                len(req.input_ids), req, self.settings.context_length, self.settings.speculative_reserved_tokens
            )
        except RequestError as e:
            return _request_error(e)
        failed = self.rng.random() < self.settings.error_rate
        slow = self.rng.random() < self.settings.slow_rate
        if failed:
            return _error("Simulated engine fault (error_rate).", self.settings.error_status)
        gen = model.generate(
            req.input_ids,
            self.params,
            max_new,
            min_new_tokens=req.min_new_tokens,
            stop=req.stop,
            stop_token_ids=req.stop_token_ids,
            ignore_eos=req.ignore_eos,
            skip_special_tokens=req.skip_special_tokens,
            no_stop_trim=req.no_stop_trim,
            # SGLang's strict-thinking grammar starts in thinking only with require_reasoning.
            max_thinking_tokens=req.max_thinking_tokens if req.require_reasoning else None,
            sampling_seed=req.sampling_seed,
        )
        gen = broken(gen, self.settings.broken_output, max_new)
        n_in, n_out = len(req.input_ids), len(gen.output_ids)
        # Like SGLang's radix cache: a prompt can be reused once its prefill is done, so
        # requests prefilled together share nothing (seen on the real engine).
        cached = self.cache.match(req.input_ids)
        spec = model.spec_fields(n_out, gen.plan.accept_length, self.settings.speculative_num_draft_tokens)
        first_token_at, retractions = await self.scheduler.run(
            n_in,
            n_in - cached,
            n_out,
            slow_factor=self.settings.slow_factor if slow else 1.0,
            verify_steps=int(spec.get("spec_verify_ct", 0)),
            on_prefilled=lambda: self.cache.insert(req.input_ids),
            max_new_tokens=max_new,
            ignore_eos=req.ignore_eos,
        )
        done = time.monotonic()
        self.request_metrics.observe(arrival, first_token_at, done, n_in, cached, n_out)
        self.cache.insert(req.input_ids + gen.output_ids)  # finished requests leave prompt+output cached
        # The keys (and order) of meta_info for a finished request, as SGLang 0.5.23's
        # engine sends them with --enable-metrics (tests/integration/sglang/test_differential.py).
        wall = received_ts - arrival  # monotonic -> wall clock
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": gen.finish_reason,
            "prompt_tokens": n_in,
            "weight_version": "default",
            "num_retractions": retractions,
            # The scheduler's own timings (no storage tier: no waits).
            "storage_prefetch_wait": 0.0,
            "storage_staging_wait": 0.0,
            "forward_entry_time": received_ts,
            "prefill_finished_time": first_token_at + wall,
            "queue_time": 0.0,
            # Counted only on request (require_reasoning): batch_result_processor._maybe_update_reasoning_tokens.
            "reasoning_tokens": gen.reasoning_tokens if req.require_reasoning else 0,
            "completion_tokens": n_out,
            "cached_tokens": cached,
            "weight_versions": [{"version": "default", "start": 0, "end": n_out}],
            "cached_tokens_details": None,
            "dp_rank": None,
            "e2e_latency": time.monotonic() - arrival,
            **spec,
        }
        if req.return_logprob:  # where SGLang puts them: after the counts, before the timings
            meta.update(model.logprobs(n_in, gen.output_ids, req.top_logprobs_num))
        # Timing keys SGLang adds (no streaming: the first token leaves with the last).
        finished_ts = time.time()
        meta.update(
            request_received_ts=received_ts,
            first_token_latency=meta["e2e_latency"],
            api_server_dispatch_finish_ts=received_ts,
            request_finished_ts=finished_ts,
            decode_throughput=(n_out - 1) / max(done - first_token_at, 1e-9) if n_out > 1 else 0.0,
            response_sent_to_client_ts=finished_ts,
        )
        return web.json_response({"text": gen.text, "output_ids": gen.output_ids, "meta_info": meta})

    def _count_for_crash(self) -> None:
        limit = self.settings.crash_after_requests
        self.received_for_crash += 1
        if limit is not None and self.received_for_crash >= limit:
            os.write(2, f"simulator: simulated crash after {self.received_for_crash} /generate requests\n".encode())
            os._exit(1)  # abrupt on purpose: no cleanup, no response, like a GPU fault

    # ---- other endpoints ------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready() else 503)

    async def server_info(self, request: web.Request) -> web.Response:
        s = self.settings
        return web.json_response(
            {
                "model_path": s.model_name,
                "served_model_name": s.model_name,
                "context_length": s.context_length,
                "max_running_requests": s.max_running_requests,
                "max_total_tokens": s.max_total_tokens,
                # SGLang's resolved server args (engine_resolution.py compares them)
                **{f"speculative_{k}": getattr(s, f"speculative_{k}") if s.speculative else None
                   for k in ("algorithm", "num_steps", "eagle_topk", "num_draft_tokens")},
                "version": VERSION,
                # SGLang appends the scheduler's internal state (scheduler_components/internal_state.py).
                "internal_states": [{"effective_max_running_requests_per_dp": s.max_running_requests}],
                "simulator": s.model_dump(),
            }
        )

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise RequestError("prompt must be a string.")
        ids = tk.encode(prompt)  # add_special_tokens has no effect: Qwen-style tokenizers add no BOS
        return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": self.settings.context_length})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in tokens):
            raise RequestError("tokens must be a list of integers.")
        skip = body.get("skip_special_tokens", True)
        try:
            text = tk.decode(tokens, skip_special_tokens=bool(skip))
        except ValueError as e:
            raise RequestError(str(e)) from None
        return web.json_response({"text": text})

    async def faults(self, request: web.Request) -> web.Response:
        if request.method == "POST":
            updates = await _json_object(request)
            unknown = sorted(set(updates) - set(FAULT_FIELDS))
            if unknown:
                raise RequestError(f"Unknown fault setting(s): {', '.join(unknown)}. Allowed: {', '.join(FAULT_FIELDS)}.")
            try:
                self.settings = SimulatorSettings.model_validate({**self.settings.model_dump(), **updates})
            except ValidationError as e:
                raise RequestError(f"Invalid fault settings: {e}") from None
            if "crash_after_requests" in updates:
                self.received_for_crash = 0
        return web.json_response(self.settings.fault_settings())


def broken(gen: model.Generation, how: str, max_new: int) -> model.Generation:
    """The output as a broken engine returns it while reporting success (the
    broken_output fault): nothing at all, token id 0 looping until EOS, or its own tokens
    reversed (drift)."""
    if not how:
        return gen
    if how == "drift":  # the same tokens in reverse order (EOS, if any, stays last)
        ids = list(gen.output_ids)
        end = ids[-1:] if ids[-1:] == [tk.EOS_ID] else []
        ids = ids[:len(ids) - len(end)][::-1] + end
        return dataclasses.replace(gen, output_ids=ids, text=tk.decode(ids[:len(ids) - len(end)]))
    ids = [] if how == "empty" else [0] * min(max_new - 1, 200)
    ids.append(tk.EOS_ID)
    return dataclasses.replace(gen, output_ids=ids, text=tk.decode(ids[:-1]), reasoning_tokens=len(ids) - 1,
                               finish_reason={"type": "stop", "matched": tk.EOS_ID})


async def _json_object(request: web.Request) -> dict:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RequestError("The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise RequestError("The request body must be a JSON object.")
    return body


@web.middleware
async def _errors(request: web.Request, handler: Callable) -> web.StreamResponse:
    """RequestError -> SGLang error body; unexpected exceptions -> 500 in the same shape."""
    try:
        return await handler(request)
    except RequestError as e:
        return _request_error(e)
    except web.HTTPException:
        raise
    except asyncio.CancelledError:
        raise
    except Exception as e:  # a simulator bug must still answer in the contract's shape
        return _error(f"Internal simulator error: {type(e).__name__}: {e}", 500)


def build_app(settings: SimulatorSettings) -> web.Application:
    sim = Simulator(settings)
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)
    app["simulator"] = sim
    app.router.add_post("/generate", sim.generate)
    app.router.add_get("/health", sim.health)
    app.router.add_get("/health_generate", sim.health)
    app.router.add_get("/server_info", sim.server_info)
    app.router.add_get("/get_server_info", sim.server_info)
    app.router.add_get("/metrics", sim.metrics)
    app.router.add_post("/tokenize", sim.tokenize)
    app.router.add_post("/detokenize", sim.detokenize)
    app.router.add_get("/sim/faults", sim.faults)
    app.router.add_post("/sim/faults", sim.faults)
    return app


async def serve(settings: SimulatorSettings, host: str, port: int) -> None:
    """Listen until SIGTERM/SIGINT, then shut down cleanly."""
    # Short shutdown grace: like SGLang on SIGTERM, in-flight requests are dropped, not drained for minutes.
    runner = web.AppRunner(build_app(settings), handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound_port = runner.addresses[0][1] if runner.addresses else port  # real port when port=0
    print(f"simulator ready on http://{host}:{bound_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
