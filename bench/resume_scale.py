"""Scale benchmark (#14): what a run's size costs a resume, next to a fresh run.

    python -m bench scale --held 90000,900000 --delays 0,0.03

For each held size N and each S3 delay, in ONE process against the real local stack
(a moto S3 server, a local Ray cluster, Serve replicas with simulated engines):

  fresh   a new run of the same ``--new`` prompts (rows N..N+new of the input)
  resume  a run pre-filled with N rows (bench/prefill.py: real parts, 256 rows each)
          resumed with the N+new-row input, so it generates exactly those new rows;
          the run's first N input rows and its admission pass over them recorded, the
          new rows appended to that file (as a user adds prompts)

both through ``jobs.runs.run.run_job``, the entry point of ``python -m jobs.generate``.
Printed per run: wall time (run_job call to return), time to first request (run_job
call to the first moment the engines' summed ``sglang:prompt_tokens_total`` rises,
polled every 50 ms: the first prefill any engine did), the resume/fresh ratio, the
time to read the resume state alone, and peak RSS of the driver and of Ray's workers
(bench/procs.py roles). A delay > 0 puts bench/latency_proxy.py in front of moto and
points storage.endpoint_url at it (the pre-fill upload bypasses it). With
``--analysis`` the largest resumed run (at the first of its delays) is then timed under
``jobs.analysis`` status, report and finalize (their main(), as the CLI runs them).

Held sizes above ``--synthetic-above`` (default 1M: e.g. ``--held 9000000``) are not
written as parts: stand-in parts under the real names with the compact index and stats
objects their sidecars give (bench/prefill.py ``synthetic_run``), which is all a resume
reads of them; measured, not extrapolated, as "after" only.

``--index before,after`` resumes each pre-filled run twice, side by side: ``before`` as
the previous raygen left it (format-3 sidecars, no compact index object, no recorded
admission pass: the N+new-row input read whole) with
``RAYGEN_INDEX_COMPACT=0`` (the index opens from every sidecar, the report reads every
data part), ``after`` with format-4 sidecars and the compact object the prefill wrote
(what a session's end writes). Each resume also prints its end-of-session report's
seconds and the compact object's write.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional
from urllib.parse import urlparse

from bench.engines import scrape
from bench.latency_proxy import LatencyProxy
from bench.modes import REPO
from bench.prefill import (cached_run, grown, input_file, recorded_input,
                           sidecar_bytes_per_row, synthetic_run, upload, upload_synthetic)
from bench.procs import ProcTree, RssSampler

logger = logging.getLogger("bench")
BUCKET = "raygen-bench"
PREFILL = "sglang:prompt_tokens_total"


class _Never(Exception):
    """run_job's stop signal: the benchmark never stops a run."""


@dataclass
class Measure:
    held: int
    delay_s: float
    mode: str            # fresh | resume
    wall_s: float
    first_request_s: Optional[float]
    rows: int
    status: str
    state_read_s: Optional[float] = None
    driver_rss_mib: float = 0.0
    workers_rss_mib: float = 0.0
    index: str = ""                      # resume: before | after (--index)
    report_s: Optional[float] = None     # the end-of-session report (report_and_write)
    compact_s: Optional[float] = None    # the compact index object's write(s)


class FirstRequest:
    """The first moment after ``start`` that any engine's prefill counter rises."""

    def __init__(self, urls: list[str], period_s: float = 0.05):
        self.urls, self.period_s = urls, period_s
        self.at: Optional[float] = None
        self._stop = threading.Event()

    def _total(self) -> float:
        return sum(scrape(u).get(PREFILL, 0.0) for u in self.urls)

    def __enter__(self) -> "FirstRequest":
        base = self._total()

        def poll() -> None:
            while not self._stop.wait(self.period_s):
                if self._total() > base:
                    self.at = time.time()
                    return
        self._thread = threading.Thread(target=poll, name="first-request", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


def settings_hash_of(cfg) -> str:
    """The settings_hash the job stamps on its rows (the one place that asks)."""
    from jobs.pipeline.settings import StageSettings
    return StageSettings.of(cfg).settings_hash


def config_tree(args: argparse.Namespace, endpoint: str, input_path: Path, run_name: str) -> dict:
    return {
        "engine": {"kind": "simulator", "model_path": "sim-scale", "context_length": 16384,
                   "max_running_requests": 48, "start_timeout_s": 120,
                   "request_timeout_s": 600, "speculative": {"algorithm": "NEXTN"},
                   "simulator": {"time_scale": args.time_scale, "accept_length": 3.0}},
        "serve": {"app_name": args.app_name, "max_ongoing_requests": 256,
                  "num_cpus_per_replica": 0.1,
                  "autoscaling": {"min_replicas": args.replicas, "max_replicas": args.replicas,
                                  "target_ongoing_requests": 48}},
        "job": {"input": str(input_path), "output": f"s3://{BUCKET}/runs", "run_name": run_name,
                "max_new_tokens": args.max_new_tokens, "min_actors": 1, "max_actors": 1,
                "inflight_rows_per_actor": 128 * args.replicas, "batch_size": 64,
                "rows_per_file": 256, "progress_interval_s": 5, "metrics_linger_s": 0},
        "storage": {"endpoint_url": endpoint},
    }


def read_state_s(cfg) -> float:
    """Seconds to read the run's resume state (what a resume reads before admission)."""
    from jobs.io.run_store import RunStore
    from jobs.io.run_index import RunIndex
    started = time.perf_counter()
    RunIndex.open(RunStore.for_run(cfg.job.output, cfg.job.run_name, cfg.storage))
    return time.perf_counter() - started


@contextlib.contextmanager
def timing(module, name: str, spent: dict[str, float]) -> Iterator[None]:
    """Sum the seconds of every call of ``module.name`` into ``spent[name]``."""
    real = getattr(module, name)

    def timed(*a, **k):
        started = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - started
    setattr(module, name, timed)
    try:
        yield
    finally:
        setattr(module, name, real)


@contextlib.contextmanager
def index_mode(mode: str) -> Iterator[None]:
    """``before``: RAYGEN_INDEX_COMPACT=0 (no compact object read or written)."""
    old = os.environ.get("RAYGEN_INDEX_COMPACT")
    if mode == "before":
        os.environ["RAYGEN_INDEX_COMPACT"] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("RAYGEN_INDEX_COMPACT", None)
        else:
            os.environ["RAYGEN_INDEX_COMPACT"] = old


def timed_run(cfg, urls: list[str], held: int, delay_s: float, mode: str) -> Measure:
    from jobs.io import index_compact
    from jobs.pipeline.settings import RunMode
    from jobs.runs import run as run_module
    tree = ProcTree()
    rss = RssSampler(tree, 0.5).start()
    spent: dict[str, float] = {}
    try:
        with FirstRequest(urls) as first, timing(run_module, "report_and_write", spent), \
                timing(index_compact, "write", spent):
            started = time.time()
            summary = run_module.run_job(cfg, RunMode(), stop_exc=_Never)
            ended = time.time()
    finally:
        rss.stop()
    rows = summary.progress["session_rows"]
    return Measure(held, delay_s, mode, ended - started,
                   None if first.at is None else first.at - started, rows, summary.status,
                   driver_rss_mib=rss.peak.get("driver", 0) / 2**20,
                   workers_rss_mib=rss.peak.get("ray_workers", 0) / 2**20,
                   report_s=spent.get("report_and_write"), compact_s=spent.get("write"))


def analysis_times(cfg, work: Path) -> dict[str, float]:
    """Wall seconds of jobs.analysis status, report and finalize on the run."""
    from jobs.analysis import finalize, report, status
    tmp = work / f"scale-storage-{uuid.uuid4().hex[:6]}.json"
    tmp.write_text(json.dumps({"storage": cfg.storage.model_dump(mode="json")}))  # YAML
    run = f"{cfg.job.output}/{cfg.job.run_name}"
    out = {}
    try:
        for name, fn in (("status", status.main), ("report", report.main),
                         ("finalize", finalize.main)):
            started = time.perf_counter()
            with contextlib.redirect_stdout(open(os.devnull, "w")):
                fn([run, "--config", str(tmp)])
            out[name] = time.perf_counter() - started
    finally:
        tmp.unlink()
    return out


@contextlib.contextmanager
def local_stack(args: argparse.Namespace) -> Iterator[str]:
    """A moto endpoint with the bench bucket and an initialised Ray: reuses what the
    caller has (pytest's fixtures), else starts its own and stops it after."""
    import ray

    from cluster.local_stack import create_bucket, set_local_aws_env, start_s3
    from serve_apps.engine_process import free_port
    set_local_aws_env()
    moto = None
    endpoint = args.endpoint or os.environ.get("RAYGEN_S3_ENDPOINT")
    if not endpoint:
        port = free_port()
        moto = start_s3(port, log_dir=Path(args.work_dir))
        endpoint = f"http://127.0.0.1:{port}"
    create_bucket(BUCKET, urlparse(endpoint).port)
    own_ray = not ray.is_initialized()
    if own_ray:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    try:
        yield endpoint
    finally:
        if own_ray:
            from ray import serve
            serve.shutdown()
            ray.shutdown()
        if moto is not None:
            moto.terminate()
            try:
                moto.wait(timeout=30)
            except subprocess.TimeoutExpired:  # a loaded machine: the figures come first
                moto.kill()


@dataclass
class ScaleResult:
    measures: list[Measure]
    analysis: dict[str, float]  # jobs.analysis command -> seconds, on analysis_rows rows
    analysis_rows: int = 0
    analysis_delay_s: float = 0.0
    sidecar: Optional[dict] = None  # bytes/row of a fresh run's data sidecars, format 4 vs 3


def run_scale(args: argparse.Namespace) -> ScaleResult:
    from ray import serve

    from bench.run import engine_urls, wait_running
    from jobs.config import StorageConfig, parse_config
    from serve_apps.app import deploy_or_attach

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    results: list[Measure] = []
    out = ScaleResult(results, {})
    with local_stack(args) as endpoint:
        moto_port = urlparse(endpoint).port
        direct = StorageConfig(endpoint_url=endpoint)
        base = parse_config(config_tree(args, endpoint, work, "probe"))
        handle = deploy_or_attach(base.engine, base.serve)
        try:
            wait_running(args.app_name)
            urls = engine_urls(handle, args.replicas)
            sh = settings_hash_of(base)
            # Unmeasured: the first job in a process pays Ray Data's worker start-up and
            # imports, which would otherwise count against whichever mode runs first.
            warm = input_file(work, min(args.new, 200), start=10**9)
            warm_cfg = parse_config(config_tree(args, endpoint, warm, f"warm-{uuid.uuid4().hex[:6]}"))
            timed_run(warm_cfg, urls, 0, 0.0, "warm-up")
            _remove(warm_cfg, direct)
            for held in args.held:
                logger.warning("scale: pre-filling %d rows (cached under %s)", held, work)
                synthetic = held > args.synthetic_above
                if synthetic:  # stand-in parts + the objects a resume reads ("after" only)
                    local_runs = {"after": synthetic_run(work, held, base, sh)}
                else:
                    local_runs = {mode: cached_run(work, held, base, sh, index=mode)
                                  for mode in args.index}
                full = input_file(work, held + args.new) if "before" in local_runs else None
                recorded = (recorded_input(work, local_runs["after"], held)
                            if "after" in local_runs else None)
                new = input_file(work, args.new, start=held)
                for delay in [d for d in args.delays if not d or held <= args.delay_max_held]:
                    with contextlib.ExitStack() as stack:
                        url = endpoint
                        if delay:
                            url = stack.enter_context(
                                LatencyProxy("127.0.0.1", moto_port, delay)).url
                        tag = f"{held}-{int(delay * 1000)}ms-{uuid.uuid4().hex[:6]}"
                        fresh = parse_config(config_tree(args, url, new, f"fresh-{tag}"))
                        fresh_m = timed_run(fresh, urls, held, delay, "fresh")
                        results.append(fresh_m)
                        if out.sidecar is None:
                            from jobs.io.run_store import RunStore
                            out.sidecar = sidecar_bytes_per_row(RunStore.for_run(
                                fresh.job.output, fresh.job.run_name, direct))
                        _remove(fresh, direct)
                        for mode in local_runs:
                            (upload_synthetic if synthetic else upload)(
                                local_runs[mode], f"s3://{BUCKET}/runs/resume-{mode}-{tag}",
                                direct)
                            with contextlib.ExitStack() as inputs, index_mode(mode):
                                # after: the recorded input with the new rows appended;
                                # before: no record (the whole pass), the same rows
                                path = (inputs.enter_context(grown(work, recorded, held,
                                                                   args.new))
                                        if mode == "after" else full)
                                resume = parse_config(config_tree(args, url, path,
                                                                  f"resume-{mode}-{tag}"))
                                state_s = read_state_s(resume)
                                m = timed_run(resume, urls, held, delay, "resume")
                                m.state_read_s, m.index = state_s, mode
                                results.append(m)
                                logger.warning("scale: %s", line(fresh_m, m))
                                if args.analysis and not synthetic and not out.analysis \
                                        and held == max(h for h in args.held
                                                        if h <= args.synthetic_above):
                                    out.analysis = analysis_times(resume, work)
                                    out.analysis_rows = held + args.new
                                    out.analysis_delay_s = delay
                            _remove(resume, direct)
        finally:
            serve.delete(args.app_name)
    return out


def _remove(cfg, storage) -> None:
    from jobs.io.storage import locate
    loc = locate(f"{cfg.job.output}/{cfg.job.run_name}", storage)
    loc.fs.delete_dir(loc.path)


def line(fresh: Measure, resume: Measure) -> str:
    return (f"{resume.held:,} held, S3 +{resume.delay_s * 1000:.0f} ms: fresh {fresh.wall_s:.1f} s "
            f"(first request {_s(fresh.first_request_s)}), resume ({resume.index}) "
            f"{resume.wall_s:.1f} s (first request {_s(resume.first_request_s)}, state read "
            f"{_s(resume.state_read_s)}, report {_s(resume.report_s)}, compact write "
            f"{_s(resume.compact_s)}), ratio {resume.wall_s / fresh.wall_s:.2f}")


def _s(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.1f} s"


def extrapolated(results: list[Measure], to_rows: int) -> Optional[str]:
    """Resume overhead (resume wall - fresh wall) and state read, fitted linearly in the
    held rows (least squares over the measured sizes, per delay) and read at ``to_rows``."""
    import numpy as np
    lines = []
    fresh = {(m.held, m.delay_s): m for m in results if m.mode == "fresh"}
    for delay, index in sorted({(m.delay_s, m.index) for m in results if m.mode == "resume"}):
        pairs = [(fresh[(r.held, delay)], r) for r in results if r.mode == "resume"
                 and (r.delay_s, r.index) == (delay, index) and (r.held, delay) in fresh]
        if len({r.held for _, r in pairs}) < 2:
            continue
        held = np.array([r.held for _, r in pairs], float)
        over = np.polyfit(held, [r.wall_s - f.wall_s for f, r in pairs], 1)
        state = np.polyfit(held, [r.state_read_s for _, r in pairs], 1)
        fresh = float(np.mean([f.wall_s for f, _ in pairs]))
        extra = float(np.polyval(over, to_rows))
        lines.append(f"- S3 +{delay * 1000:.0f} ms, index {index}, {to_rows:,} held (synthetic, linear fit "
                     f"over {', '.join(f'{int(h):,}' for h in held)}): resume overhead "
                     f"{extra:.0f} s, resume state read {np.polyval(state, to_rows):.0f} s, "
                     f"ratio {(fresh + extra) / fresh:.1f} against the mean fresh run "
                     f"({fresh:.1f} s)")
    return "\n".join(lines) or None


def markdown(result: ScaleResult, command: str, synthetic: int = 9_000_000) -> str:
    results = result.measures
    rows = ["| held rows | S3 delay | mode | rows generated | wall s | first request s | "
            "resume state read s | resume/fresh | driver RSS MiB | Ray workers RSS MiB | "
            "index | report s | compact write s |",
            "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    fresh: dict[tuple[int, float], Measure] = {}
    for m in results:
        if m.mode == "fresh":
            fresh[(m.held, m.delay_s)] = m
        f = fresh.get((m.held, m.delay_s))
        ratio = f"{m.wall_s / f.wall_s:.2f}" if m.mode == "resume" and f else ""
        rows.append(f"| {m.held:,} | {m.delay_s * 1000:.0f} ms | {m.mode} | {m.rows:,} | "
                    f"{m.wall_s:.1f} | {_s(m.first_request_s).removesuffix(' s')} | "
                    f"{_s(m.state_read_s).removesuffix(' s') if m.mode == 'resume' else ''} | "
                    f"{ratio} | {m.driver_rss_mib:.0f} | {m.workers_rss_mib:.0f} | {m.index} | "
                    f"{_s(m.report_s).removesuffix(' s')} | "
                    f"{_s(m.compact_s).removesuffix(' s') if m.compact_s else ''} |")
    text = f"Command: `{command}`\n\n" + "\n".join(rows) + "\n"
    if result.sidecar:
        text += (f"\nData sidecars of the fresh run ({result.sidecar['rows']:,} rows): "
                 f"{result.sidecar['format_4']:.1f} B/row (format 4, with the report's "
                 f"statistics), {result.sidecar['format_3']:.1f} B/row as format 3\n")
    extra = (None if any(m.held >= synthetic for m in results)  # measured
             else extrapolated(results, synthetic))
    if extra:
        text += "\n" + extra + "\n"
    if result.analysis:
        text += (f"\njobs.analysis on the resumed run ({result.analysis_rows:,} rows, S3 "
                 f"+{result.analysis_delay_s * 1000:.0f} ms): "
                 + ", ".join(f"{k} {v:.1f} s" for k, v in result.analysis.items()) + "\n")
    return text


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--held", default="90000,900000", help="held rows, comma-separated")
    p.add_argument("--new", type=int, default=3000, help="new rows each run generates")
    p.add_argument("--delays", default="0,0.03", help="S3 delays in seconds, comma-separated")
    p.add_argument("--delay-max-held", type=int, default=10**9,
                   help="run the delays > 0 only for held sizes up to this (they are slow)")
    p.add_argument("--synthetic-above", type=int, default=1_000_000,
                   help="held sizes above this are filled synthetically: stand-in parts, "
                        "their compact index and stats objects (bench/prefill.py "
                        "synthetic_run), resumed as 'after' only")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--time-scale", type=float, default=0.02)
    p.add_argument("--max-new-tokens", type=int, default=4096)
    p.add_argument("--analysis", action="store_true",
                   help="also time status/report/finalize on the largest resumed run")
    p.add_argument("--endpoint", help="an existing moto/S3 endpoint (default: start one)")
    p.add_argument("--app-name", default="raygen-scale")
    p.add_argument("--work-dir", default=str(REPO / ".local" / "bench-scale"))
    p.add_argument("--out", help="also write the markdown table here")
    p.add_argument("--index", default="after",
                   help="before,after: resume each pre-filled run as the previous raygen "
                        "left it (format-3 sidecars, no compact object, "
                        "RAYGEN_INDEX_COMPACT=0) and/or as this one does")
    a = p.parse_args(argv)
    a.index = [x for x in a.index.split(",") if x]
    if not a.index or set(a.index) - {"before", "after"}:
        p.error(f"--index takes before and/or after, got {','.join(a.index)!r}")
    a.held = [int(x) for x in a.held.split(",") if x]
    a.delays = [float(x) for x in a.delays.split(",") if x]
    return a


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    args = parse_args(argv)
    result = run_scale(args)
    text = markdown(result, "python -m bench scale " + " ".join(map(shlex.quote, argv or [])))
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0 if all(m.status == "succeeded" for m in result.measures) else 1
