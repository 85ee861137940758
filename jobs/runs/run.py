"""Run a generation job end to end (called by jobs/generate.py after config checks).

``run_job`` is one session: take the run's lease, read its index (jobs/io/run_index.py,
the resume state), plan what to send (jobs/runs/plans.py), claim and deploy the engines,
then a :class:`Session` streams the dataset into the run with progress.json, the
watchdog, the lease's fence and the job's metrics around it, and ends with the run's
verdict and summary.
"""

from __future__ import annotations

import _thread
import logging
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

import ray

from jobs.analysis import gpu_hours
from jobs.analysis.report import report_and_write
from jobs.config import RunConfig
from jobs.io import index_compact
from jobs.io.run_index import RunIndex, describe as describe_index
from jobs.io.run_store import RunStore, UnknownRunFormat
from jobs.io.storage import exception_chain, is_local, storage_full, write_json_atomic
from jobs.pipeline import chain as pipeline
from jobs.pipeline.retry import CircuitOpen
from jobs.pipeline import warmup
from jobs.pipeline.settings import RunMode, StageSettings
from jobs.runs import plans
from jobs.runs.context_check import check_context as run_check, describe as describe_check
from jobs.runs.engine_idle import EngineIdleWatch, describe as describe_idle
from jobs.runs.errors import FencedRunError, RunError
from jobs.runs.job_metrics import JobGauges, dashboard_url
from jobs.runs.lease import LeaseHeld, RunLease, UnsafeStore
from jobs.runs.progress import ProgressTracker
from jobs.runs.regenerate import collect_published, flagged_fields
from jobs.runs.provenance import record_session as record_provenance
from jobs.runs.watchdog import Watchdog, diagnose
from serve_apps.app import deploy_or_attach, deployed_engine_hash, deployment_options
from serve_apps.app_claims import AppInUse, claim_app

logger = logging.getLogger("raygen")


@dataclass
class Summary:
    status: str
    progress: dict[str, Any]
    text: str


def find_cause(exc: BaseException, kind: type) -> Optional[BaseException]:
    """The first ``kind`` in ``exc``'s chain (io.storage.exception_chain), else None."""
    return next((link for link in exception_chain(exc) if isinstance(link, kind)), None)


def summary_text(store: RunStore, index: RunIndex, snap: dict[str, Any],
                 versions_as: str = "continued", samples: int = 1) -> str:
    # a continued row counts once, as its latest version
    counts = sorted(index.finish_counts().items(), key=lambda kv: (-kv[1], str(kv[0])))
    mix = ", ".join(f"{r}={n}" for r, n in counts) or "none"  # most first: stable text
    return "\n".join([
        f"run {snap['run']}: {snap['status']}",
        f"  output:    {store.uri}/data/",
        f"  rows:      {snap['completed']} done of {snap['total']} "
        f"({snap['failed']} failed, {snap['rejected']} rejected)"
        + (f"; {snap['outside_input']} more rows whose prompt left the input (kept)"
           if snap.get("outside_input") else ""),
        f"  finish:    {mix}  (truncated {100 * snap['truncated_fraction']:.1f}%)",
        f"  tokens:    {snap['output_tokens']} output, mean {snap['mean_output_tokens']}",
        f"  session:   {_session_rows(snap, versions_as, samples)} in {snap['elapsed_s']} s; "
        f"{snap['session_rows'] / max(snap['elapsed_s'], 1e-9):.1f} rows/s, "
        f"{snap['session_output_tokens'] / max(snap['elapsed_s'], 1e-9):.0f} output tok/s",
        f"  progress:  {store.uri}/progress.json",
    ])


def _session_rows(snap: dict[str, Any], versions_as: str = "continued", samples: int = 1) -> str:
    """'N rows written' and what they were: new prompts, or new samples of n-sample runs
    (retried failures, keys lost to damaged parts among them), new versions of held rows
    (continued or regenerated, with the tokens that added)."""
    rows = snap["session_rows"]
    new = snap.get("session_new_prompts", rows)
    versions = snap.get("session_new_versions", rows - new)
    parts = []
    if new:
        among = [f"{n} {what}" for n, what in (
            (snap.get("session_retried_failures"), "retried failures"),
            (snap.get("session_regenerated_damaged"), "lost to damaged parts")) if n]
        what = f"new samples, {samples} per prompt" if samples > 1 else "new prompts"
        parts.append(f"{new} {what}" + (f" ({', '.join(among)})" if among else ""))
    if versions:
        added = snap.get("session_tokens_added")
        parts.append(f"{versions} {versions_as}"
                     + (f" ({added:+,} tokens)" if added is not None else ""))
    return f"{rows} rows written" + (f": {', '.join(parts)}" if parts else "")


def _report(store: RunStore, index: RunIndex) -> tuple[str, Optional[dict[str, Any]]]:
    """End-of-run report (report.md/json/png) and its summary line; a report problem
    never fails the run (None: no report)."""
    try:
        report = report_and_write(store, index=index)
    except Exception as exc:  # noqa: BLE001
        logger.warning("report failed (the data is intact): %s", exc)
        return "", None
    return (f"\n  report:    {store.uri}/report.md (python -m jobs.analysis.report "
            f"{store.uri})"), report


def interruptible_main_thread() -> None:
    """Let the watchdog and the lease fence interrupt the session (``_thread.interrupt_main``,
    from their threads). A process started with SIGINT ignored (``nohup ... &``, a
    non-interactive shell's background job: how 30-hour runs get started) gets no Python
    SIGINT handler, and interrupt_main then does nothing: a stalled session would hang
    on and a fenced driver go on writing. Call in the main thread."""
    if not callable(signal.getsignal(signal.SIGINT)):  # SIG_IGN or SIG_DFL
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _init_ray(stop_exc: type) -> None:
    """Connect to Ray, then take SIGTERM back: `ray job stop` must end in "stopped"."""
    ray.init(ignore_reinit_error=True)
    if threading.current_thread() is threading.main_thread():
        interruptible_main_thread()
        def _stop(*_):  # ray.init installs its own handler, which fails the dataset
            raise stop_exc()  # while a Session streams, its own handler comes first
        signal.signal(signal.SIGTERM, _stop)


def local_output_problem(output_is_local: bool, alive_nodes: int, shared: bool) -> Optional[str]:
    """Why a local output path cannot work on this cluster (None when it can)."""
    if not output_is_local or shared or alive_nodes <= 1:
        return None
    return (f"job.output is a local path but the Ray cluster has {alive_nodes} nodes: each "
            f"node's writers would write their own copy of the run and resume would miss "
            f"rows. Use s3://..., or, if the path is a filesystem every node mounts, set "
            f"storage.shared_local_output: true")


def check_output_reachable(store: RunStore, cfg: RunConfig) -> None:
    alive = sum(1 for node in ray.nodes() if node.get("Alive"))
    problem = local_output_problem(is_local(store.root), alive, cfg.storage.shared_local_output)
    if problem:
        raise RunError(problem)


def take_lease(store: RunStore, cfg: RunConfig):
    """The run's lease, or RunError naming the live job that holds it."""
    try:
        return RunLease(store, cfg.job.lease_timeout_s).acquire()
    except (LeaseHeld, UnsafeStore) as exc:
        raise RunError(str(exc)) from None


def claim_engines(cfg: RunConfig, store: RunStore):
    """This run's claim on its Serve app (serve_apps/app_claims.py), or RunError naming
    the live run whose engines it would replace."""
    try:
        return claim_app(cfg.serve.app_name, store.uri, deployed_engine_hash(cfg.engine),
                         cfg.job.lease_timeout_s)
    except AppInUse as exc:
        raise RunError(str(exc)) from None


def engine_context_length(handle, cfg: RunConfig) -> int:
    """The context length the running engine reports (config's value if it says none)."""
    info = handle.info.remote().result()
    reported = (info.get("server_info") or {}).get("context_length")
    return int(reported or cfg.engine.context_length)


def run_job(cfg: RunConfig, mode: RunMode, stop_exc: type,
            check_context: bool = False) -> Summary:
    """One session of the run in ``mode`` (jobs/runs/plans.py says what each mode sends)."""
    store = RunStore.for_run(cfg.job.output, cfg.job.run_name, cfg.storage)
    inputs = plans.input_locations(cfg)
    if check_context:
        _init_ray(stop_exc)
        with claim_engines(cfg, store):
            handle = deploy_or_attach(cfg.engine, cfg.serve)
            report = run_check(cfg, store, inputs, engine_context_length(handle, cfg))
        return Summary("succeeded", report, describe_check(report))
    stage = StageSettings.of(cfg, mode)
    lease = take_lease(store, cfg)  # before the run's state is read or anything written
    warm = None
    try:
        try:
            store.init_run_file()  # the run's format and key salt, before any part
        except UnknownRunFormat as exc:
            raise RunError(str(exc)) from None
        if warmup.enabled() and warmup.cluster_running():  # also while the plan is made; a
            _init_ray(stop_exc)  # local run starts no Ray before the plan's reject guard
            warm = warmup.start(3 * pipeline.LIGHT_TASKS, pipeline.LIGHT_CPU)  # read, validate, write
        started = time.monotonic()
        index = RunIndex.open(store)  # the resume state: what the run's files hold
        logger.info("run index read in %.1f s: %s", time.monotonic() - started,
                    describe_index(index))
        index_compact.maybe_write(index, index_compact.OPEN_COMPACT_PARTS,  # many uncovered
                                  stats=False)  # the end writes them, from the report's read
        plan = plans.plan(cfg, store, inputs, index, mode, stage)
        _init_ray(stop_exc)
        if warm is None:  # the pipeline's processes start while the engines are deployed
            warm = warmup.start(3 * pipeline.LIGHT_TASKS, pipeline.LIGHT_CPU)
        check_output_reachable(store, cfg)
        with claim_engines(cfg, store):
            deploying = time.time()  # the session's GPU-hours count from here
            handle = deploy_or_attach(cfg.engine, cfg.serve)
            idle = EngineIdleWatch(cfg.serve.app_name, deployment_options(
                cfg.engine, cfg.serve)["ray_actor_options"]["num_gpus"],  # engines ready: t0
                held_since=deploying)
            record_provenance(cfg, store, mode, handle)  # <run>/provenance.json, changes logged
            return Session(cfg, store, plan, stop_exc, lease=lease, index=index,
                           versions_as=mode.strategy.versions_as, warm=warm,
                           engine_idle=idle).run()
    finally:
        if warm is not None:
            warm.close()
        lease.release()


def dry_run(cfg: RunConfig, mode: RunMode) -> Summary:
    """What a fresh or retry-failed session would send (jobs/runs/plans.py): no Ray,
    no lease, no writes."""
    counts, text = plans.dry_run(cfg, mode)
    return Summary("succeeded", counts, text)


def _classify_failure(exc: BaseException, stop_exc: type) -> tuple[str, Optional[str]]:
    """(status, error message): a wrapped stop signal is a stop, not a failure."""
    if find_cause(exc, stop_exc) or find_cause(exc, KeyboardInterrupt):
        return "stopped", None
    breaker, full = find_cause(exc, CircuitOpen), storage_full(exc)
    if full is not None:
        error = (f"output storage is full: {full}. Every row written so far is durable and "
                 f"no temp file is left; free space there and rerun the same command to "
                 f"resume.")
    else:
        error = str(breaker) if breaker else f"{type(exc).__name__}: {exc}"
    logger.error("run failed: %s", error)
    return "failed", error


def verdict(snap: dict[str, Any], expect_all: bool) -> tuple[str, Optional[str]]:
    """The status of a run whose pipeline ended without an error, from its files:
    "succeeded" only if every admitted prompt has a result and something was generated."""
    if expect_all and snap["remaining"] > 0:
        return "failed", (
            f"{snap['remaining']} of {snap['total']} prompts have no result in data/, "
            f"failures/ or rejects/ although the pipeline ended: rerun the same command to "
            f"finish them")
    if not snap["completed"]:
        return "failed", (
            f"nothing was generated: of {snap['total']} prompts {snap['rejected']} were "
            f"rejected (see rejects/) and {snap['failed']} failed (see failures/)")
    return "succeeded", None


def _write_status_now(progress, status: str) -> None:
    """progress.json with the final status at once, from the last counts (no rescan)."""
    progress.status = status  # the progress thread's next write says it too
    if progress.last is not None and not progress.fence():  # fenced: not ours to write
        write_json_atomic(progress.store.loc("progress.json"),
                          dict(progress.last, status=status, updated_at=time.time()))


class Session:
    """One session's stream into the run: the plan's dataset written, with progress.json,
    the watchdog, the lease's fence and SIGTERM around it, then the verdict, the summary
    and the report. What the progress thread (stalled), the lease's thread (fenced) and
    the SIGTERM handler tell the main thread is this object's state; its handler is
    installed only while it streams. A session that ended fenced raises FencedRunError."""

    def __init__(self, cfg: RunConfig, store: RunStore, plan: plans.Plan, stop_exc: type,
                 lease=None, index: Optional[RunIndex] = None, versions_as: str = "continued",
                 warm=None, engine_idle=None):
        self.cfg, self.store, self.plan, self.stop_exc = cfg, store, plan, stop_exc
        self.lease, self.index, self.versions_as = lease, index, versions_as
        self.warm, self.engine_idle = warm, engine_idle
        self.stalled: Optional[str] = None  # the watchdog's reason: the session stalled
        self.fenced: Optional[str] = None   # the lease's reason: stop dispatching
        self.progress: Optional[ProgressTracker] = None

    def fence(self) -> Optional[str]:
        """Why this driver may no longer write (its lease is lost), else None."""
        return self.lease.fenced() if self.lease is not None else None

    def _on_stall(self, silent_s: float, limit_s: float) -> None:  # in the progress thread
        cfg = self.cfg
        stage = diagnose(cfg.serve.app_name, cfg.serve.deployment_name, limit_s)
        self.stalled = (f"stalled: no row became durable for {silent_s:.0f} s (the "
                        f"watchdog's limit: {limit_s:.0f} s, job.stall_factor/"
                        f"stall_min_s); {stage}. Rerun the same command to resume.")
        logger.error("run %s %s", cfg.job.run_name, self.stalled)
        _write_status_now(self.progress, "stalled")
        _thread.interrupt_main()  # the pipeline's wait ends; the lease is released below

    def _on_fence(self, reason: str) -> None:  # in the lease's thread: stop dispatching
        self.fenced = reason
        if not self.stalled:  # else the main thread was interrupted already (a second
            _thread.interrupt_main()  # interrupt would land in its clean-up)

    def _on_sigterm(self, *_) -> None:
        """SIGTERM: the truth first, then the slow teardown (`ray job stop` SIGKILLs the
        driver 3 s after SIGTERM, sooner than the dataset's teardown)."""
        try:
            _write_status_now(self.progress, "stopped")
            if self.lease is not None:
                self.lease.release()
        except Exception as exc:  # noqa: BLE001 - never block the stop itself
            logger.warning("on stop: %s", exc)
        raise self.stop_exc()

    def _track(self) -> ProgressTracker:
        cfg, engine_idle = self.cfg, self.engine_idle
        watchdog = Watchdog(cfg.job.stall_factor, cfg.job.stall_min_s,
                            cfg.engine.request_timeout_s)
        return ProgressTracker(
            self.store, self.plan.total, cfg.job.run_name, cfg.engine.model_name,
            cfg.job.progress_interval_s, JobGauges.for_config(cfg), index=self.index,
            watchdog=watchdog, on_stall=self._on_stall, counts=self.plan.counts,
            fence=self.fence, engine_idle=engine_idle,
            gpu_held=(lambda: engine_idle.held) if engine_idle else None,
            gpus_per_engine=engine_idle.gpus if engine_idle else None,
            price_per_gpu_hour=cfg.job.price_per_gpu_hour)

    def _stream(self) -> tuple[str, Optional[str], dict[str, Any]]:
        """Write the dataset: (status, error, the final progress snapshot)."""
        cfg, store, progress, stop_exc = self.cfg, self.store, self.progress, self.stop_exc
        handling = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, self._on_sigterm) if handling else None
        status, error = "failed", None
        try:
            if self.warm is not None:
                self.warm.release()
            pipeline.write(self.plan.build(), cfg, store.uri)
            status, error = verdict(progress.update(), self.plan.expect_all)
        except (stop_exc, KeyboardInterrupt):  # `ray job stop` (SIGTERM), Ctrl-C, lease lost
            status = "stopped"
            if self.lease is not None and self.lease.lost:
                error = f"stopped: {self.lease.lost} (one job per run)"
            elif self.fenced:
                error = f"stopped: {self.fenced}. Rerun the same command to resume."
            if self.stalled:  # the watchdog interrupted the pipeline
                status, error = "stalled", self.stalled
        except Exception as exc:  # noqa: BLE001 - reported below with the cause
            status, error = _classify_failure(exc, stop_exc)
            if self.stalled:  # the interrupt surfaced wrapped in the pipeline's own error
                status, error = "stalled", self.stalled
        finally:
            if handling:  # None: a handler not set from Python (never so after _init_ray)
                signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
            try:
                if status != "succeeded":
                    _write_status_now(progress, status)
                snap = progress.stop(status)  # writes progress.json only while not fenced
            except OSError as exc:  # a full disk: the session's error must still be said
                logger.error("final status not written to %s: %s", store.uri, exc)
                snap = dict(progress.last or {}, status=status)
            time.sleep(cfg.job.metrics_linger_s)  # let Prometheus scrape the final gauges
        return status, error, snap

    def run(self) -> Summary:
        """Stream, then say how it ended: the summary, or RunError with it."""
        cfg, store = self.cfg, self.store
        if self.lease is not None:
            self.lease.on_fence = self._on_fence
        if threading.current_thread() is threading.main_thread():
            # the fence and the watchdog stop the session with interrupt_main: a session
            # not started through _init_ray (in-process, under `nohup ... &`) needs it too
            interruptible_main_thread()
        self.progress = progress = self._track().start()
        url = dashboard_url(cfg.job.run_name, cfg.engine.model_name)
        if url:  # in the driver log, i.e. on the job's page of the Ray dashboard
            logger.info("raygen dashboard for this run: %s", url)
        status, error, snap = self._stream()
        if snap["failed"] and status == "succeeded":
            logger.warning("%d rows failed; see %s/failures/ and rerun with --retry-failed",
                           snap["failed"], store.uri)
        text = summary_text(store, progress.index, snap, self.versions_as,
                            cfg.job.samples_per_prompt)
        if self.engine_idle is not None:
            text += "\n" + describe_idle(snap.get("engine_idle_gpu_s"))
        for line in gpu_hours.describe(snap.get("gpu_hours"), snap.get("remaining")):
            text += "\n" + line
        if status == "succeeded" and snap["session_rows"] == 0 and not snap["remaining"]:
            text += "\n  nothing to do: every prompt already has a result"
        if self.lease is not None and self.lease.takeover:
            text += f"\n  lease:     {self.lease.takeover}"
        if not self.fence():  # a driver that lost its lease writes nothing over the next's
            try:  # drains whose record reached no result: before what to regenerate is decided
                collect_published(store, cfg.job.run_name)
            except Exception as exc:  # noqa: BLE001 - the results' records still count
                logger.warning("drained replicas' published records not read: %s", exc)
            line, report = _report(store, progress.index)
            text += line
            if report is not None:  # progress.json says what the end found (regenerate.py)
                snap = progress.add_final(flagged_fields(report))
            index_compact.maybe_write(progress.index)  # the next open: O(sessions) reads
        if error:
            raise (FencedRunError if self.fence() is not None else RunError)(
                f"{error}\n{text}")
        return Summary(status, snap, text)
