"""The three ways of driving the same prompts through the same engines.

Each runner returns a ModeResult with per-row timings (``done_at``: wall time the
row's result was available to the caller; ``latency_s``: one request's
tokenize+generate time as its caller measured it) and the mode's wall window
(started -> everything written). CPU/RSS are filled in by ``measured``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from bench.engines import EngineWatch
from bench.procs import COMPONENTS, ProcTree, RssSampler, engine_cpu_s

REPO = Path(__file__).resolve().parents[1]


@dataclass
class ModeResult:
    mode: str
    expected_rows: int
    rows: int = 0
    errors: int = 0
    output_tokens: int = 0
    spec_verify_steps: int = 0  # raygen: the rows' spec_verify_ct summed
    started_at: float = 0.0
    ended_at: float = 0.0
    done_at: np.ndarray = field(default_factory=lambda: np.zeros(0))
    durable_at: np.ndarray = field(default_factory=lambda: np.zeros(0))  # file written, per row
    latency_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cpu_s: dict[str, float] = field(default_factory=dict)   # by component (procs.COMPONENTS)
    engine_cpu_s: float = 0.0   # the engines' own processes over the mode (procs.engine_cpu_s)
    peak_rss: dict[str, int] = field(default_factory=dict)  # by role
    peak_rss_total: int = 0     # peak of (driver + actors/workers + replicas), or the client
    watch: Optional[EngineWatch] = None
    notes: list[str] = field(default_factory=list)
    idle_gpu_s: Optional[dict] = None  # raygen: progress.json's engine_idle_gpu_s
    retractions: Optional[float] = None  # the engines' retraction counters over the mode
    inflight: str = ""  # rows in flight: a number, or "adaptive (at most N)"


@dataclass
class Context:
    """What every mode shares: one prompt file, one config, the same engines."""
    cfg: Any                 # jobs.config.RunConfig of mode (a); (b) and (c) copy its settings
    tree: dict[str, Any]     # the raw config tree (per-mode run names are set on copies)
    prompts: Path
    rows: int
    work_dir: Path
    engine_urls: list[str]
    inflight: int
    actors: int
    proc_tree: ProcTree
    rss_period_s: float = 0.5
    keep_outputs: bool = False
    sweep: tuple[int, ...] = ()  # plain_sweep's concurrencies


@contextmanager
def measured(ctx: Context, result: ModeResult, count_tree: bool = True) -> Iterator[None]:
    """Engine counters, CPU snapshots and RSS sampling around one mode."""
    watch = EngineWatch(ctx.engine_urls).start()
    sampler = RssSampler(ctx.proc_tree, ctx.rss_period_s).start() if count_tree else None
    before = ctx.proc_tree.snapshot()
    engines_before = engine_cpu_s(ctx.proc_tree.root_pid)
    try:
        yield
    finally:
        after = ctx.proc_tree.snapshot()
        result.engine_cpu_s = engine_cpu_s(ctx.proc_tree.root_pid) - engines_before
        if sampler is not None:
            sampler.stop()
        watch.stop()
        result.watch = watch
        result.retractions = watch.retractions()
        if watch.failed_scrapes:
            # An engine replaced during the mode, or one that did not answer /metrics in
            # bench.engines.scrape's 5 s (32 replicas on 2 cores: no engine was replaced).
            result.notes.append(
                f"{watch.failed_scrapes} engine scrapes failed (an engine replaced or "
                f"unanswered in 5 s)" + ("" if watch.trustworthy() else
                                         ": engine-side figures are invalid"))
        if count_tree:
            cpu = {c: after.cpu_s[c] - before.cpu_s[c] for c in COMPONENTS}
            # The benchmark's own threads run in the driver: not raygen's cost.
            cpu["driver"] -= watch.thread_cpu_s + sampler.thread_cpu_s
            result.cpu_s = cpu
            result.peak_rss = dict(sampler.peak)
            result.peak_rss_total = sampler.peak_workers_total


class _Never(Exception):
    pass


def run_raygen(ctx: Context, warm: bool = True, inflight: Optional[str] = None) -> ModeResult:
    """(a) raygen: jobs.runs.run.run_job with the config (engines already deployed: it
    attaches); ``warm`` False: with RAYGEN_WARM_START=0 (the start-up before
    jobs/pipeline/warmup.py); ``inflight``: job.inflight (adaptive | fixed) over the
    config's."""
    from jobs.config import parse_config
    from jobs.pipeline.settings import RunMode
    from jobs.runs.run import run_job
    from jobs.io.run_store import RunStore
    from jobs.io.storage import list_files

    tree = json.loads(json.dumps(ctx.tree))
    tree["job"]["run_name"] = f"bench-{uuid.uuid4().hex[:8]}"
    if inflight is not None:
        tree["job"]["inflight"] = inflight
    cfg = parse_config(tree)
    name = "raygen" if warm else "raygen_cold"
    res = ModeResult(name if inflight is None else f"{name}_{inflight}", ctx.rows)
    most = cfg.job.inflight_rows_per_actor * cfg.job.max_actors
    res.inflight = f"{most}" if cfg.job.inflight == "fixed" else f"adaptive, at most {most}"
    before = os.environ.get("RAYGEN_WARM_START")
    os.environ["RAYGEN_WARM_START"] = "1" if warm else "0"  # read by run_job in this process
    try:
        with measured(ctx, res):
            res.started_at = time.time()
            summary = run_job(cfg, RunMode(), stop_exc=_Never)
            res.ended_at = time.time()
    finally:
        if before is None:
            os.environ.pop("RAYGEN_WARM_START", None)
        else:
            os.environ["RAYGEN_WARM_START"] = before
    res.idle_gpu_s = summary.progress.get("engine_idle_gpu_s")
    store = RunStore.for_run(cfg.job.output, cfg.job.run_name, cfg.storage)
    data = store.read_kind("data", ["created_at", "latency_s", "completion_tokens",
                                    "spec_verify_ct"])
    res.rows = data.num_rows
    res.errors = summary.progress["failed"] + summary.progress["rejected"]
    res.output_tokens = int(np.asarray(data.column("completion_tokens")).sum())
    res.spec_verify_steps = int(data.column("spec_verify_ct").fill_null(0).to_numpy().sum())
    created = data.column("created_at").cast("int64").to_numpy()  # ms since epoch, UTC
    res.done_at = created.astype(np.float64) / 1000.0
    res.latency_s = np.asarray(data.column("latency_s"), dtype=np.float64)
    res.durable_at = durable_times(store.root.fs, list_files(store.loc("data"), ".parquet"))
    if summary.status != "succeeded":
        res.notes.append(f"run status {summary.status}")
    if not ctx.keep_outputs:
        _remove(store.root)
    return res


def run_plain_sweep(ctx: Context) -> list[ModeResult]:
    """(b) at each of the sweep's concurrencies (``--sweep``): the best is the anchor."""
    return [run_plain(ctx, c) for c in ctx.sweep]


def run_plain(ctx: Context, concurrency: Optional[int] = None) -> ModeResult:
    """(b) the plain asyncio client, in its own process, against the replicas' engines;
    ``concurrency`` rows in flight (default: the run's)."""
    concurrency = concurrency or ctx.inflight
    run_dir = ctx.work_dir / f"plain-{uuid.uuid4().hex[:8]}"
    run_dir.mkdir(parents=True)
    job = ctx.cfg.job
    spec = {"urls": ctx.engine_urls, "prompts": str(ctx.prompts), "limit": None,
            "sampling": job.main_sampling.to_sglang(), "max_new_tokens": job.max_new_tokens,
            "concurrency": concurrency, "out_dir": str(run_dir / "data"),
            "flush_rows": job.rows_per_file, "result_prefix": str(run_dir / "result"),
            "request_timeout_s": ctx.cfg.engine.request_timeout_s}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    res = ModeResult("plain" if concurrency == ctx.inflight and not ctx.sweep
                     else f"plain@{concurrency}", ctx.rows, inflight=str(concurrency))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    with measured(ctx, res, count_tree=False):
        res.started_at = time.time()
        subprocess.run([sys.executable, "-m", "bench.plain_client", "--spec",
                        str(run_dir / "spec.json")], check=True, cwd=REPO, env=env)
        res.ended_at = time.time()
    summary = json.loads((run_dir / "result.json").read_text())
    res.rows, res.errors = summary["rows"], summary["errors"]
    res.output_tokens = summary["output_tokens"]
    res.done_at = np.load(run_dir / "result.done_at.npy")
    res.latency_s = np.load(run_dir / "result.latency.npy")
    res.durable_at = durable_times(*_local_files(run_dir / "data"))
    res.cpu_s = {"client": summary["total_cpu_s"]}
    res.peak_rss = {"client": summary["max_rss_bytes"]}
    res.peak_rss_total = summary["max_rss_bytes"]
    res.notes.append(f"client CPU after imports: {summary['work_cpu_s']:.2f} s")
    if not ctx.keep_outputs:
        _remove_dir(run_dir)
    return res


def run_raydata_llm(ctx: Context) -> ModeResult:
    """(c) ray.data.llm ServeDeploymentProcessorConfig -> generate_many on the same app."""
    import pyarrow.parquet as pq

    from bench.raydata_llm import build_dataset
    from jobs.pipeline.settings import StageSettings

    run_dir = ctx.work_dir / f"raydata-llm-{uuid.uuid4().hex[:8]}"
    stage = StageSettings.of(ctx.cfg)
    # Same rows in flight as the other modes: each actor runs 4 batches at once
    # (Ray Data's default max_concurrency for async batch UDFs).
    batch = max(1, ctx.inflight // (ctx.actors * 4))
    res = ModeResult("raydata_llm", ctx.rows)
    res.notes.append(f"{ctx.actors} actors x 4 concurrent batches x batch_size {batch}")
    with measured(ctx, res):
        res.started_at = time.time()
        ds = build_dataset(str(ctx.prompts), ctx.cfg.serve.app_name,
                           ctx.cfg.serve.deployment_name, stage, batch, ctx.actors)
        ds.write_parquet(str(run_dir / "data"))
        res.ended_at = time.time()
    table = pq.read_table(run_dir / "data",
                          columns=["done_at", "latency_s", "completion_tokens", "error_class"])
    ok = table.filter(table.column("error_class").is_null())
    res.rows, res.errors = ok.num_rows, table.num_rows - ok.num_rows
    res.output_tokens = int(np.asarray(ok.column("completion_tokens")).sum())
    res.done_at = np.asarray(ok.column("done_at"), dtype=np.float64)
    res.latency_s = np.asarray(ok.column("latency_s"), dtype=np.float64)
    res.durable_at = durable_times(*_local_files(run_dir / "data"))
    if not ctx.keep_outputs:
        _remove_dir(run_dir)
    return res


def durable_times(fs, infos) -> np.ndarray:
    """Per row, the wall time its Parquet file was written (the file's mtime)."""
    import pyarrow.parquet as pq
    parts = []
    for info in infos:
        with fs.open_input_file(info.path) as f:
            rows = pq.ParquetFile(f).metadata.num_rows
        parts.append(np.full(rows, info.mtime.timestamp() if info.mtime else np.nan))
    return np.concatenate(parts) if parts else np.zeros(0)


def _local_files(folder: Path):
    import pyarrow.fs as pafs
    fs = pafs.LocalFileSystem()
    infos = fs.get_file_info(pafs.FileSelector(str(folder), recursive=True))
    return fs, [i for i in infos if i.type == pafs.FileType.File and i.path.endswith(".parquet")]


RUNNERS = {"raygen": run_raygen, "raygen_cold": lambda ctx: run_raygen(ctx, warm=False),
           "raygen_fixed": lambda ctx: run_raygen(ctx, inflight="fixed"),
           "raygen_adaptive": lambda ctx: run_raygen(ctx, inflight="adaptive"),
           "plain": run_plain, "plain_sweep": run_plain_sweep,
           "raydata_llm": run_raydata_llm}


def _remove(loc) -> None:
    try:
        loc.fs.delete_dir(loc.path)
    except Exception:  # noqa: BLE001 - leftovers are harmless
        pass


def _remove_dir(path: Path) -> None:
    import shutil
    shutil.rmtree(path, ignore_errors=True)
