"""SGLang 0.5.23's real HTTP stack on CPU, with a fake scheduler whose tokens are the simulator's.

Run as its own process (the tests start it once per session, see conftest.py):

    python -m tests.contract.sglang.sglang_stack --context-length 1000 --port-file F

What is real: SGLang's FastAPI app (entrypoints/http_server.py) served by uvicorn with
SGLang's keep-alive (SGLANG_TIMEOUT_KEEP_ALIVE, 5 s), its TokenizerManager (request
contract, sampling validation, context check, meta_info), DetokenizerManager (text,
stop trimming), and on the scheduler side its Req finish logic
(Req.update_finish_state), reasoning counter, input check (validate_input_length),
budget clamp (Scheduler.init_req_max_new_tokens), output streamer and metrics collector.
What is fake: the scheduler loop (no model, no KV cache). Its "model" is the simulator's
(serve_apps/engines/simulator/model.py): for each request it feeds the tokens the
simulator would produce, one at a time, and SGLang's Req decides when to stop.

A separate process because SGLang sets process-wide state at import and start (the
Prometheus multiprocess directory, its runtime context, env defaults) that must not leak
into the test process. Nothing here is a copy of SGLang's code: it calls it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import types
from pathlib import Path

# SGLang's multiprocess metrics need the directory before prometheus_client is imported.
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="sglang-prom-"))

from tests.contract.sglang import sglang_cpu  # noqa: E402  (torchvision shim first)



def _fake_scheduler(port_args, server_args, max_req_len: int, max_req_input_len: int,
                    model_dir: str, sim_params) -> None:
    """One loop on SGLang's ZMQ IPC: receive tokenized requests, stream real outputs back."""
    import zmq
    from sglang.srt import runtime_context as rc
    from sglang.srt.managers.io_struct import (GetInternalStateReq, GetInternalStateReqOutput,
                                               TokenizedGenerateReqInput, sock_recv, sock_send)
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components.batch_result_processor import (
        SchedulerBatchResultProcessor)
    from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer
    from sglang.srt.managers.utils import validate_input_length
    from sglang.srt.observability.metrics_collector import (QueueCount, SchedulerMetricsCollector,
                                                            SchedulerStats)
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

    from serve_apps.engines.simulator import model as sim_model
    from serve_apps.engines.simulator import tokenizer as sim_tok

    ctx = zmq.Context()
    rx = ctx.socket(zmq.PULL)
    rx.connect(port_args.scheduler_input_ipc_name)
    to_detok = ctx.socket(zmq.PUSH)
    to_detok.connect(port_args.detokenizer_ipc_name)
    to_tok = ctx.socket(zmq.PUSH)
    to_tok.connect(port_args.tokenizer_ipc_name)
    tokenizer = get_tokenizer(model_dir)
    # The attributes init_req_max_new_tokens reads from a Scheduler (KV pool large enough
    # never to bind: only the context rules apply).
    sched = types.SimpleNamespace(
        max_new_tokens_limit=None, max_req_len=max_req_len, max_total_num_tokens=1 << 30,
        kv_shard_widening=1, page_size=1, sliding_window_size=None, chunked_prefill_size=None,
        token_to_kv_pool_allocator=types.SimpleNamespace(
            page_size=1, max_new_tokens_for_memory=lambda i, m, **k: m))
    result_processor = types.SimpleNamespace(model_config=types.SimpleNamespace(
        think_end_ids=[sim_tok.THINK_END_ID], self_opened_think_start_ids=None))
    streamer = SchedulerOutputStreamer(
        send_to_detokenizer=types.SimpleNamespace(send_output=lambda p: sock_send(to_detok, p)),
        tree_cache=None, server_args=server_args, is_generation=True,
        spec_algorithm=SpeculativeAlgorithm.from_string(rc.get_spec().speculative_algorithm),
        disaggregation_mode=rc.get_disagg().disaggregation_mode,
        enable_hicache_storage=lambda: False)
    collector = SchedulerMetricsCollector(
        labels={"model_name": "oracle", "engine_type": "unified", "tp_rank": "0",
                "pp_rank": "0", "moe_ep_rank": "0"}, server_args=server_args)
    stats = SchedulerStats()
    stats.num_running_reqs, stats.num_queue_reqs = QueueCount(0), QueueCount(0)
    collector.log_stats(stats)  # the gauges exist from the start, as on a real server

    while True:
        obj = sock_recv(rx)
        if isinstance(obj, GetInternalStateReq):
            sock_send(to_tok, GetInternalStateReqOutput(internal_state={
                "effective_max_running_requests_per_dp": server_args.max_running_requests}))
            continue
        if not isinstance(obj, TokenizedGenerateReqInput):
            continue
        req = Req(obj.rid, obj.input_text, obj.input_ids, obj.sampling_params, stream=obj.stream,
                  require_reasoning=obj.require_reasoning, eos_token_ids={sim_tok.EOS_ID},
                  vocab_size=len(tokenizer), time_stats=obj.time_stats,
                  http_worker_ipc=obj.http_worker_ipc)
        req.tokenizer = tokenizer
        Scheduler.init_req_max_new_tokens(sched, req)
        error = validate_input_length(req, max_req_input_len, False)
        if error:
            req.set_finish_with_abort(error)
            req.update_finish_state()
        else:
            sp = req.sampling_params
            # The simulator's token stream for this prompt; SGLang's Req decides the finish.
            stream = sim_model.generate(list(obj.input_ids), sim_params, sp.max_new_tokens,
                                        min_new_tokens=sp.min_new_tokens,
                                        ignore_eos=sp.ignore_eos).output_ids
            for token in stream:
                req.output_ids.append(token)
                SchedulerBatchResultProcessor._maybe_update_reasoning_tokens(
                    result_processor, req, token)
                req.update_finish_state(1)
                if req.finished():
                    break
            if sim_params.accept_length > 1.0:
                # Verify steps and accepted drafts as the simulator's plan has them; the
                # tokenizer manager derives the spec_* meta_info from these two counters.
                plan = sim_model.make_plan(
                    list(obj.input_ids)[:sim_model.core_length(obj.input_ids)], sim_params)
                spec = sim_model.spec_fields(len(req.output_ids), plan.accept_length)
                req.spec_verify_ct = spec["spec_verify_ct"]
                req.spec_num_correct_drafts = spec["spec_num_correct_drafts"]
        streamer.stream_output([req], False)


# raygen's shipped speculative settings (NEXTN 3/1/4): SGLang reserves 4 tokens per request.
SPECULATIVE_ARGS = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
                    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def start(model_dir: str, context_length: int, sim_params) -> tuple[object, object]:
    """Bring the stack up in this process; returns (FastAPI app, server_args)."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.entrypoints import http_server as hs
    from sglang.srt.entrypoints.engine import init_tokenizer_manager
    from sglang.srt.entrypoints.openai.serving_tokenize import OpenAIServingTokenize
    from sglang.srt.managers import detokenizer_manager as dm
    from sglang.srt.managers.tokenizer_manager import ServerStatus
    from sglang.srt.server_args import PortArgs, prepare_server_args
    from sglang.srt.utils.common import add_prometheus_middleware

    server_args = prepare_server_args([
        "--model-path", model_dir, "--device", "cpu", "--context-length", str(context_length),
        "--reasoning-parser", "qwen3", "--enable-metrics", "--skip-server-warmup",
        "--max-running-requests", "48",
        *(SPECULATIVE_ARGS if sim_params.accept_length > 1.0 else [])])
    rc.publish(server_args, role="tokenizer")
    port_args = PortArgs.init_new(server_args)
    tokenizer_manager, template_manager = init_tokenizer_manager(server_args, port_args)
    dm.start_cpu_monitor_thread = lambda *a, **k: None  # one process: one metrics registry
    detokenizer = dm.DetokenizerManager(server_args, port_args)
    threading.Thread(target=detokenizer.event_loop, daemon=True).start()

    # tp_worker: max_req_len = min(context - 1, kv - 1); max_req_input_len = max_req_len - 5.
    max_req_len = tokenizer_manager.context_len - 1
    max_req_input_len = max_req_len - 5
    rc.get_parallel().override_permanently(attn_tp_rank=0, tp_rank=0, dp_rank=None)
    threading.Thread(target=_fake_scheduler, daemon=True,
                     args=(port_args, server_args, max_req_len, max_req_input_len, model_dir,
                           sim_params)).start()
    tokenizer_manager.max_req_input_len = max_req_input_len
    hs.set_global_state(hs._GlobalState(
        tokenizer_manager=tokenizer_manager, template_manager=template_manager,
        scheduler_info={"max_req_input_len": max_req_input_len,
                        "max_total_num_tokens": 1 << 30}))
    tokenizer_manager.server_status = ServerStatus.Up
    add_prometheus_middleware(hs.app)
    # What http_server.lifespan() sets for /tokenize.
    hs.app.state.openai_serving_tokenize = OpenAIServingTokenize(tokenizer_manager,
                                                                 template_manager)
    return hs.app, server_args


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context-length", type=int, default=1000)
    parser.add_argument("--median-tokens", type=float, default=24.0)
    parser.add_argument("--sigma", type=float, default=0.3)
    parser.add_argument("--speculative", action="store_true",
                        help="NEXTN 3/1/4; the simulator's accept model gives the spec counters")
    parser.add_argument("--model-dir", default=None, help="default: a fresh temporary folder")
    parser.add_argument("--port-file", required=True, help="the bound port is written here")
    args = parser.parse_args(argv)

    import uvicorn
    from sglang.srt.environ import envs

    from serve_apps.engines.simulator import model as sim_model

    model_dir = args.model_dir or tempfile.mkdtemp(prefix="sglang-oracle-model-")
    sglang_cpu.write_fake_model(Path(model_dir))
    sim_params = sim_model.LengthParams(median_tokens=args.median_tokens, sigma=args.sigma,
                                        accept_length=3.0 if args.speculative else 0.0)
    app, _ = start(model_dir, args.context_length, sim_params)
    # SGLang's own keep-alive (http_server.launch_server passes the same value). No
    # lifespan: it would start SGLang's multi-process tokenizer set-up and warm-up, which
    # start() replaces for this one process.
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off",
                            timeout_keep_alive=envs.SGLANG_TIMEOUT_KEEP_ALIVE.get())
    server = uvicorn.Server(config)

    def announce() -> None:
        while not server.started:
            threading.Event().wait(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        tmp = args.port_file + ".tmp"
        Path(tmp).write_text(str(port))
        os.replace(tmp, args.port_file)

    threading.Thread(target=announce, daemon=True).start()
    server.run()


if __name__ == "__main__":
    sys.exit(main())
