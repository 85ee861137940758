"""Orchestrate one benchmark run: prompts -> engines -> each mode in turn -> table.

Usable standalone (``python -m bench ...`` starts a local Ray cluster and stops it)
and inside a process where Ray is already initialised (pytest's ray_cluster
fixture): then it uses that cluster and only deletes its own Serve app.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from bench.engines import capacity_tok_s
from bench.modes import REPO, RUNNERS, Context
from bench.procs import ProcTree
from bench.prompts import prompt_file
from bench.report import Figures, figures, kv_table, markdown

logger = logging.getLogger("bench")
MODES = ("raygen", "plain", "raydata_llm")
# Only when asked for: raygen with RAYGEN_WARM_START=0; raygen with job.inflight fixed or
# adaptive whatever the config says; the plain client at each --sweep concurrency.
EXTRA_MODES = ("raygen_cold", "raygen_fixed", "raygen_adaptive", "plain_sweep")
DATA_MODES = ("raygen", "raygen_cold", "raygen_fixed", "raygen_adaptive",
              "raydata_llm")  # the modes that run a Ray Data job
ENGINES = ("simulator", "sglang-cpu", "sglang-cpu-spec")


@dataclass
class Options:
    prompts: int = 10_000
    replicas: int = 4
    time_scale: float = 0.1
    zero_latency: bool = False
    modes: tuple[str, ...] = MODES
    out: Optional[str] = None
    output: Optional[str] = None     # raygen's job.output (default: local, under work_dir)
    work_dir: str = str(REPO / ".local" / "bench")
    inflight: Optional[int] = None   # rows in flight, every mode (default replicas x 64)
    actors: int = 2                  # raygen generate actors / ray.data.llm actors
    max_running: int = 48
    max_new_tokens: Optional[int] = None  # default: 4096 on the simulator, 256 on sglang-cpu
    engine: str = "simulator"        # or sglang-cpu: SGLang's real engine on this CPU;
    #                                  sglang-cpu-spec: the same, speculative (STANDALONE)
    app_name: str = "raygen-bench"
    seed: int = 0
    keep_outputs: bool = False
    rss_period_s: float = 0.5
    overrides: list[str] = field(default_factory=list)  # raygen config --set dotted=value
    env: dict[str, str] = field(default_factory=dict)  # env vars for a cluster we start
    data_coordinator: str = "fresh"  # fresh: removed before each Ray Data mode; kept
    max_total_tokens: Optional[int] = None  # each engine's KV pool (default: none on the
    #                                  simulator, 65,536 on sglang-cpu)
    sweep: tuple[int, ...] = ()      # plain_sweep: the plain client's concurrencies

    @property
    def scale(self) -> float:
        return 0.0 if self.zero_latency else self.time_scale

    @property
    def budget(self) -> int:
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        return {"sglang-cpu": 256, "sglang-cpu-spec": 64}.get(self.engine, 4096)


@dataclass
class BenchResult:
    options: Options
    figures: list[Figures]
    markdown: str
    engine_urls: list[str]
    capacity_tok_s: Optional[float]


def engine_section(opt: Options) -> dict[str, Any]:
    """The simulator (capacity and timing set here), or SGLang's real engine on this CPU
    serving the sampled test model (story-like lengths at a 256-token budget)."""
    if opt.engine == "sglang-cpu":
        from serve_apps.engines.sglang_cpu import models
        return {"kind": "sglang", "device": "cpu", "model_path": str(models.ensure("sampled")),
                "served_model_name": "raygen-tiny-sampled", "chat_template": "builtin",
                "context_length": 4096, "max_total_tokens": opt.max_total_tokens or 65536,
                "max_running_requests": opt.max_running, "start_timeout_s": 600,
                "request_timeout_s": 3600}
    if opt.engine == "sglang-cpu-spec":
        # The scripted model drafted by the draft model (serve_apps/engines/sglang_cpu/
        # models.py): every row is the same 38 greedy tokens; the draft is wrong while
        # thinking and right after, so the accept length is SGLang's to count.
        from serve_apps.engines.sglang_cpu import models
        return {"kind": "sglang", "device": "cpu", "model_path": str(models.ensure("scripted")),
                "served_model_name": "raygen-tiny-scripted", "chat_template": "builtin",
                "context_length": 4096, "max_total_tokens": 65536,
                "max_running_requests": opt.max_running, "start_timeout_s": 600,
                "request_timeout_s": 3600,
                "speculative": {"algorithm": "STANDALONE", "num_steps": 1, "eagle_topk": 1,
                                "num_draft_tokens": 2,
                                "draft_model_path": str(models.ensure("draft"))}}
    return {"kind": "simulator", "model_path": "sim-bench", "context_length": 16384,
            "max_running_requests": opt.max_running, "start_timeout_s": 120,
            "request_timeout_s": 3600, "speculative": {"algorithm": "NEXTN"},
            "simulator": {"time_scale": opt.scale, "accept_length": 3.0,
                          "max_total_tokens": opt.max_total_tokens}}


def config_tree(opt: Options, prompts: Path, inflight: int) -> dict[str, Any]:
    storage: dict[str, Any] = {}
    if opt.output and opt.output.startswith("s3://"):
        storage["endpoint_url"] = os.environ.get("RAYGEN_S3_ENDPOINT")
    job = {"input": str(prompts), "output": opt.output or str(Path(opt.work_dir) / "runs"),
           "run_name": "bench", "max_new_tokens": opt.budget,
           "min_actors": opt.actors, "max_actors": opt.actors,
           "inflight_rows_per_actor": max(1, inflight // opt.actors),
           "batch_size": 64, "max_batches_per_actor": 8, "rows_per_file": 256,
           "progress_interval_s": 5,
           "metrics_linger_s": 0}  # no Prometheus here: do not time a deliberate idle wait
    if opt.engine == "sglang-cpu":  # the sampled model's lengths are made for plain sampling
        job["sampling"] = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}
    if opt.engine == "sglang-cpu-spec":
        job["sampling"] = {"temperature": 0.0}
    from jobs.config import rows_per_replica
    tree = {
        "engine": engine_section(opt),
        "serve": {"app_name": opt.app_name,
                  "max_ongoing_requests": max(opt.max_running,
                                              2 * rows_per_replica(inflight, opt.replicas)),
                  "num_cpus_per_replica": 0.1,
                  "autoscaling": {"min_replicas": opt.replicas, "max_replicas": opt.replicas,
                                  "target_ongoing_requests": opt.max_running}},
        "job": job,
        "storage": storage,
    }
    from jobs.config import apply_overrides
    return apply_overrides(tree, list(opt.overrides))


def engine_urls(handle, replicas: int, attempts: int = 50) -> list[str]:
    """Ask the replicas (through Serve's router) until every engine URL has been seen."""
    urls: set[str] = set()
    for _ in range(attempts):
        calls = [handle.info.remote() for _ in range(4 * replicas)]
        urls.update(c.result()["engine_url"] for c in calls)
        if len(urls) >= replicas:
            break
    if len(urls) != replicas:
        raise RuntimeError(f"found {len(urls)} engine URLs for {replicas} replicas: {urls}")
    return sorted(urls)


def wait_running(app_name: str, timeout_s: float = 120.0) -> None:
    from ray import serve
    deadline = time.time() + timeout_s
    while True:
        status = serve.status().applications.get(app_name)
        if status is not None and status.status == "RUNNING":
            return
        if time.time() > deadline:
            raise RuntimeError(f"Serve app {app_name} not RUNNING after {timeout_s:.0f}s: {status}")
        time.sleep(0.5)


def data_coordinator(state: str) -> None:
    """Ray Data's autoscaling coordinator (a detached actor the first dataset of a cluster
    creates) as each Ray Data mode should find it, whatever ran before: ``fresh`` removes
    it (the first Ray Data job of a cluster), ``kept`` makes sure it runs (a cluster that
    ran a job before). Only on the cluster this run started."""
    import ray
    import ray.data
    if state == "kept":
        ray.data.range(1).materialize()
        return
    try:
        ray.kill(ray.get_actor("AutoscalingCoordinator", namespace="AutoscalingCoordinator"))
    except ValueError:  # not created yet
        pass


def code_version() -> str:
    """The raygen commit and whether jobs/ or serve_apps/ differ from it (others edit here)."""
    import subprocess
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--",
                                "jobs", "serve_apps"], capture_output=True, text=True,
                               check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"
    changed = [line[3:] for line in dirty if line.strip()]
    return head + (f" + uncommitted changes in {', '.join(changed)}" if changed else "")


def machine() -> str:
    try:
        model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                      if l.startswith("model name")), platform.processor())
    except OSError:
        model = platform.processor()
    import psutil
    import ray
    mem = psutil.virtual_memory().total / 2**30
    return (f"{os.cpu_count()} cores ({model}), {mem:.0f} GiB RAM, Python "
            f"{platform.python_version()}, ray {ray.__version__}, load average "
            f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")


def run_bench(opt: Options, argv: Optional[list[str]] = None) -> BenchResult:
    import ray
    from ray import serve

    from jobs.config import parse_config
    from serve_apps.app import deploy_or_attach

    unknown = set(opt.modes) - set(MODES + EXTRA_MODES)
    if unknown:
        raise ValueError(f"unknown modes {sorted(unknown)}; choose from {MODES + EXTRA_MODES}")
    if opt.engine not in ENGINES:
        raise ValueError(f"unknown engine {opt.engine!r}; choose from {ENGINES}")
    work = Path(opt.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    inflight = opt.inflight or opt.replicas * max(64, opt.max_running)
    prompts = prompt_file(work, opt.prompts, opt.seed)
    tree = config_tree(opt, prompts, inflight)
    cfg = parse_config(tree)

    own_ray = not ray.is_initialized()
    if opt.env and not own_ray:
        raise ValueError("--env needs a cluster this run starts (Ray is already initialised)")
    if own_ray:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.update(opt.env)  # inherited by raylet and every worker
        # As tests/integration/conftest.py: more logical CPUs than cores (every raygen
        # stage reserves a fraction of a CPU and is I/O-bound).
        ray.init(address="local", num_cpus=8, include_dashboard=True,
                 dashboard_host="127.0.0.1", log_to_driver=False)
    machine_line, version = machine(), code_version()
    try:
        deploy_began = time.monotonic()
        handle = deploy_or_attach(cfg.engine, cfg.serve)
        wait_running(opt.app_name)  # else run_job's deploy_or_attach would redeploy
        deploy_s = time.monotonic() - deploy_began
        urls = engine_urls(handle, opt.replicas)
        # Only the simulator states its capacity; a real engine's is what it does.
        capacity = capacity_tok_s(urls) if opt.engine == "simulator" else None
        ctx = Context(cfg=cfg, tree=tree, prompts=prompts, rows=opt.prompts, work_dir=work,
                      engine_urls=urls, inflight=inflight, actors=opt.actors,
                      proc_tree=ProcTree(), rss_period_s=opt.rss_period_s,
                      keep_outputs=opt.keep_outputs, sweep=opt.sweep)
        results = []
        for mode in opt.modes:
            if own_ray and mode in DATA_MODES:
                data_coordinator(opt.data_coordinator)
            logger.warning("bench: mode %s, %d prompts ...", mode, opt.prompts)
            out = RUNNERS[mode](ctx)
            for res in out if isinstance(out, list) else [out]:
                logger.warning("bench: mode %s done in %.1f s", res.mode,
                               res.ended_at - res.started_at)
                results.append(res)
            time.sleep(1.0)  # let the engines' last scrape and the pools settle
        accept_line = _accept_line(opt, results, urls)
    finally:
        try:
            serve.delete(opt.app_name)
        except Exception as exc:  # noqa: BLE001
            logger.warning("could not delete Serve app %s: %s", opt.app_name, exc)
        if own_ray:
            serve.shutdown()
            ray.shutdown()

    plains = [r for r in results if r.mode == "plain" or r.mode.startswith("plain@")]
    plain_tok_s = max((r.output_tokens / (r.ended_at - r.started_at) for r in plains),
                      default=None)  # the best plain client is the anchor
    if opt.engine == "simulator":
        sim = cfg.engine.simulator
        full_batch = sim.max_decode_tok_s / sim.per_request_decode_tok_s
        engines = (f"{opt.replicas} simulated engines (max_running_requests {opt.max_running}, "
                   f"max_decode_tok_s 3500, per_request_decode_tok_s 100, time_scale "
                   f"{opt.scale}, NEXTN accept 3.0)")
    else:
        full_batch = float(opt.max_running)
        model = ("the scripted test model drafted by the draft model, STANDALONE 1 step"
                 if opt.engine == "sglang-cpu-spec" else "the sampled test model")
        engines = (f"{opt.replicas} real SGLang 0.5.23 engines on this CPU ({model}, "
                   f"max_running_requests {opt.max_running}; they share the cores "
                   f"with raygen, so each mode's CPU share is reported)")
    figs = [figures(r, capacity, plain_tok_s, full_batch) for r in results]
    command = "python -m bench " + " ".join(shlex.quote(a) for a in (argv or []))
    header = [
        f"Command: `{command}`",
        "",
        f"Settings: {opt.prompts} prompts (jobs.demo_prompts.build, seed {opt.seed}), "
        f"{opt.replicas} replicas = {engines}, "
        f"max_new_tokens {opt.budget}, "
        + (f"KV pool {cfg.engine.max_total_tokens if opt.engine != 'simulator' else opt.max_total_tokens:,} "
           f"tokens per engine, " if opt.max_total_tokens else "")
        + f"{inflight} rows in flight in every mode"
        + (f" (plain_sweep: {', '.join(map(str, opt.sweep))})" if opt.sweep else "") + "; "
        f"raygen: {opt.actors} generate actors x {max(1, inflight // opt.actors)} in flight, "
        f"batch 64, 8 batches/actor, 256 rows/file, serve.max_ongoing_requests "
        f"{cfg.serve.max_ongoing_requests}, metrics_linger_s 0, output "
        f"{'S3' if (opt.output or '').startswith('s3://') else 'local Parquet'}"
        f"{'; overrides ' + ', '.join(opt.overrides) if opt.overrides else ''}"
        f"{'; env ' + ', '.join(f'{k}={v}' for k, v in opt.env.items()) if opt.env else ''}"
        + (f"; Ray Data's coordinator {opt.data_coordinator} before each Ray Data mode"
           if own_ray else "") +
        ".",
        "",
        f"Deploy: {opt.replicas} replicas running in {deploy_s:.1f} s "
        f"({deploy_s / opt.replicas:.2f} s per replica; Serve's controller starts them "
        f"together, so this is the fan-out's cost, not one replica's).",
        "",
        f"Machine: {machine_line}.",
        "",
        f"raygen code: commit {version}.",
    ] + (["", accept_line] if accept_line else [])
    text = markdown(figs, header)
    if any(f.retractions for f in figs) or opt.max_total_tokens:
        text += "\n" + kv_table(figs)
    if opt.out:
        Path(opt.out).write_text(text)
    return BenchResult(opt, figs, text, urls, capacity)


def _accept_line(opt: Options, results: list, urls: list[str]) -> Optional[str]:
    """Speculative engines: raygen's accept length beside the engines' own (bench/speculation.py)."""
    raygen = next((r for r in results if r.mode == "raygen"), None)
    if opt.engine != "sglang-cpu-spec" or raygen is None:
        return None
    import ray

    from bench import speculation
    session = Path(ray._private.worker.global_worker.node.get_session_dir_path())
    return speculation.summary_line(raygen.output_tokens, raygen.spec_verify_steps,
                                    [speculation.engine_average(u) for u in urls],
                                    speculation.log_lines(opt.app_name, session))


def parse_args(argv: Optional[list[str]]) -> Options:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--prompts", type=int, default=10_000)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--time-scale", type=float, default=0.1,
                   help="simulator wall s per simulated s (default 0.1)")
    p.add_argument("--zero-latency", action="store_true", help="time_scale 0")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--out", help="also write the markdown table here")
    p.add_argument("--output", help="raygen job.output (default: local dir under --work-dir)")
    p.add_argument("--work-dir", default=str(REPO / ".local" / "bench"))
    p.add_argument("--inflight", type=int, help="rows in flight (default replicas x 64)")
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--max-running", type=int, default=48,
                   help="engine.max_running_requests of each engine (default 48)")
    p.add_argument("--max-new-tokens", type=int,
                   help="budget per row (default 4096; 256 with --engine sglang-cpu, "
                   "64 with sglang-cpu-spec)")
    p.add_argument("--engine", choices=ENGINES, default="simulator",
                   help="sglang-cpu: SGLang's real engine on this CPU, the sampled test model; "
                   "sglang-cpu-spec: the scripted model with speculative decoding (STANDALONE, "
                   "the draft model), printing raygen's accept length beside the engines'")
    p.add_argument("--keep-outputs", action="store_true")
    p.add_argument("--data-coordinator", choices=("fresh", "kept"), default="fresh",
                   help="Ray Data's autoscaling coordinator before each Ray Data mode: fresh "
                        "(removed: the cluster's first Ray Data job) or kept (running)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="raygen config override, e.g. --set serve.max_ongoing_requests=128")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment of the Ray cluster this run starts")
    p.add_argument("--max-total-tokens", type=int,
                   help="each engine's KV pool in tokens (default: none on the simulator, "
                   "65536 on sglang-cpu); small enough and the pool binds: engines retract")
    p.add_argument("--sweep", default="",
                   help="plain_sweep's concurrencies, e.g. 4,8,16,32 (with --modes "
                   "plain_sweep,raygen_fixed,raygen_adaptive: the KV pool comparison)")
    a = p.parse_args(argv)
    return Options(prompts=a.prompts, replicas=a.replicas, time_scale=a.time_scale,
                   zero_latency=a.zero_latency,
                   modes=tuple(m.strip() for m in a.modes.split(",") if m.strip()),
                   out=a.out, output=a.output, work_dir=a.work_dir, inflight=a.inflight,
                   actors=a.actors, max_running=a.max_running,
                   max_new_tokens=a.max_new_tokens, engine=a.engine,
                   keep_outputs=a.keep_outputs, overrides=a.set,
                   data_coordinator=a.data_coordinator,
                   max_total_tokens=a.max_total_tokens,
                   sweep=tuple(int(c) for c in a.sweep.split(",") if c.strip()),
                   env=dict(e.partition("=")[::2] for e in a.env))


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    result = run_bench(parse_args(argv), argv)
    print(result.markdown)
    return 0
