"""Run a generation job end to end (called by jobs/generate.py after config checks)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

import pyarrow as pa
import pyarrow.compute as pc

from jobs.config import RunConfig
from jobs.run_store import RunStore
from jobs.storage import Location, locate

if TYPE_CHECKING:
    from jobs.admission import Admission, PriorRun

logger = logging.getLogger("raygen")


class RunError(RuntimeError):
    """The run cannot start or had to stop; the message says what to do next."""


@dataclass
class Summary:
    status: str
    progress: dict[str, Any]
    text: str


@dataclass
class RunState:
    """What the run's own files already hold (the only resume state there is)."""

    prior: "PriorRun"  # done / open failed keys as digests, known reject ids
    first_budgets: dict[tuple[str, int], int]  # (settings_hash, first budget) -> rows

    @classmethod
    def read(cls, store: RunStore) -> "RunState":
        from jobs.admission import PriorRun
        data = read_columns(store, "data", ["key", "settings_hash", "budget_history",
                                            "prompt_hash"])
        budgets: dict[tuple[str, int], int] = {}
        for sh, hist in zip(data.column("settings_hash").to_pylist(),
                            data.column("budget_history").to_pylist()):
            budgets[(sh, hist[0])] = budgets.get((sh, hist[0]), 0) + 1
        rej = read_columns(store, "rejects", ["source", "line", "reject_id"])
        reject_ids = [i or f"{s}:{n}" for i, s, n in zip(*(rej.column(c).to_pylist() for c in (
            "reject_id", "source", "line")))]
        failed = read_columns(store, "failures", ["key"]).column("key")
        prior = PriorRun.from_columns(_values(data.column("key")),
                                      _values(data.column("prompt_hash")),
                                      _values(failed), reject_ids)
        return cls(prior=prior, first_budgets=budgets)


def _values(column: pa.ChunkedArray):
    """A column's values one chunk at a time (no list of every key at once)."""
    for chunk in column.chunks:
        yield from chunk.to_pylist()


def read_columns(store: RunStore, kind: str, columns: list[str]) -> pa.Table:
    """Some columns of every part of a kind; a column a part predates reads as nulls."""
    import pyarrow.parquet as pq

    from jobs.schema import KINDS
    schema = pa.schema([KINDS[kind].field(c) for c in columns])
    tables = []
    for path in store.part_paths(kind):
        with store.root.fs.open_input_file(path) as f:
            pf = pq.ParquetFile(f)
            have = [c for c in columns if c in pf.schema_arrow.names]
            t = pf.read(columns=have)
        for c in columns:
            if c not in have:
                t = t.append_column(schema.field(c), pa.nulls(t.num_rows, schema.field(c).type))
        tables.append(t.select(columns).cast(schema))
    return pa.concat_tables(tables) if tables else schema.empty_table()


def check_settings(state: RunState, settings_hash: str, budget: int, run: str) -> None:
    """Refuse to mix budgets or sampling settings inside one run (the story's bug)."""
    others = {k: n for k, n in state.first_budgets.items() if k != (settings_hash, budget)}
    if not others:
        return
    (other_hash, other_budget), rows = max(others.items(), key=lambda kv: kv[1])
    raise RunError(
        f"run {run!r} already holds {rows} rows generated with max_new_tokens="
        f"{other_budget} (settings {other_hash}); this config asks max_new_tokens={budget} "
        f"(settings {settings_hash}). Resuming would mix budgets and leave the earlier rows "
        f"under the old one. To give truncated rows a larger budget run "
        f"`python -m jobs.generate --config ... --continue-truncated --max-total-tokens "
        f"{budget}`; for different settings use a new job.run_name.")


def input_locations(cfg: RunConfig) -> list[Location]:
    locs = [locate(uri, cfg.storage) for uri in cfg.job.input]
    for loc in locs:
        info = loc.fs.get_file_info(loc.path)
        if info.type.name != "File":
            raise RunError(f"job.input {loc.uri!r} does not exist (or is not a file)")
    return locs


def find_cause(exc: BaseException, kind: type) -> Optional[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def summary_text(store: RunStore, snap: dict[str, Any]) -> str:
    from jobs.continuation import latest_versions
    data = latest_versions(store)  # a continued row counts once, as its latest version
    reasons = pc.value_counts(data.column("finish_reason")).to_pylist() if data.num_rows else []
    mix = ", ".join(f"{r['values']}={r['counts']}" for r in reasons) or "none"
    return "\n".join([
        f"run {snap['run']}: {snap['status']}",
        f"  output:    {store.uri}/data/",
        f"  rows:      {snap['completed']} done of {snap['total']} "
        f"({snap['failed']} failed, {snap['rejected']} rejected)",
        f"  finish:    {mix}  (truncated {100 * snap['truncated_fraction']:.1f}%)",
        f"  tokens:    {snap['output_tokens']} output, mean {snap['mean_output_tokens']}",
        f"  session:   {snap['session_rows']} new rows in {snap['elapsed_s']} s: "
        f"{snap['session_rows'] / max(snap['elapsed_s'], 1e-9):.1f} rows/s, "
        f"{snap['session_output_tokens'] / max(snap['elapsed_s'], 1e-9):.0f} output tok/s",
        f"  progress:  {store.uri}/progress.json",
    ])


def _report(store: RunStore) -> str:
    """End-of-run report (report.md/json/png); a report problem never fails the run."""
    from jobs.report import report_and_write
    try:
        report_and_write(store)
    except Exception as exc:  # noqa: BLE001
        logger.warning("report failed (the data is intact): %s", exc)
        return ""
    return f"\n  report:    {store.uri}/report.md (python -m jobs.report {store.uri})"


def _init_ray(stop_exc: type) -> None:
    """Connect to Ray, then take SIGTERM back: `ray job stop` must end in "stopped"."""
    import signal
    import threading

    import ray
    ray.init(ignore_reinit_error=True)
    if threading.current_thread() is threading.main_thread():
        def _stop(*_):  # ray.init installs its own handler, which fails the dataset
            raise stop_exc()
        signal.signal(signal.SIGTERM, _stop)


def engine_context_length(handle, cfg: RunConfig) -> int:
    """The context length the running engine reports (config's value if it says none)."""
    info = handle.info.remote().result()
    reported = (info.get("server_info") or {}).get("context_length")
    return int(reported or cfg.engine.context_length)


def run_job(cfg: RunConfig, retry_failed: bool, continue_truncated: bool,
            max_total_tokens: Optional[int], stop_exc: type,
            check_context: bool = False) -> Summary:
    import ray

    from jobs import continuation, pipeline
    from jobs.sources import count_rows
    from serve_apps.app import deploy_or_attach

    store = RunStore.for_run(cfg.job.output, cfg.job.run_name, cfg.storage)
    inputs = input_locations(cfg)
    ctx = pipeline.stage_context(cfg)
    state = RunState.read(store)
    if check_context or continue_truncated:
        total = sum(min(count_rows(loc), cfg.job.limit or 1 << 62) for loc in inputs)
    if check_context:
        from jobs.context_check import check_context as run_check, describe
        _init_ray(stop_exc)
        handle = deploy_or_attach(cfg.engine, cfg.serve)
        report = run_check(cfg, store, inputs, engine_context_length(handle, cfg))
        return Summary("succeeded", report, describe(report))
    if continue_truncated:
        target = continuation.check_total(cfg, max_total_tokens)
        wanted = continuation.to_continue(store, target)
        logger.info("continuing %d truncated rows to %d total tokens", len(wanted), target)
        _init_ray(stop_exc)
        deploy_or_attach(cfg.engine, cfg.serve)
        return _execute(cfg, store, total, stop_exc,
                        lambda: continuation.build(cfg, store, wanted, target), cleanup=None)
    check_settings(state, ctx["settings_hash"], cfg.job.max_new_tokens, cfg.job.run_name)
    from jobs.admission import reject_writer
    reject_parts: list[list[dict[str, Any]]] = []
    admission = admit(cfg, store, inputs, state, retry_failed, reject_parts.append)
    _init_ray(stop_exc)
    deploy_or_attach(cfg.engine, cfg.serve)
    table = [ray.put(admission.table)]  # in a list: each admit task fetches it once

    def build():
        # The new rejects are written once progress has taken its first look, so the
        # job's reject counter counts them as this session's, as it did when the
        # stream wrote them.
        write = reject_writer(store)
        for part in reject_parts:
            write(part)
        return pipeline.build(cfg, inputs, table, store.uri)
    return _execute(cfg, store, admission.total, stop_exc, build, cleanup=None)


def admit(cfg: RunConfig, store: RunStore, inputs: list[Location], state: RunState,
          retry_failed: bool, write_rejects: Callable) -> "Admission":
    """The driver's admission pass (jobs/admission.py); records the input fingerprints
    in <run>/inputs.json and says what changed since the last session."""
    import time

    from jobs.admission import admit_inputs, describe_changes
    from jobs.storage import write_json_atomic
    started = time.monotonic()
    admission = admit_inputs(inputs, state.prior, retry_failed, write_rejects, cfg.job.limit)
    for line in describe_changes(admission, (store.read_json("inputs.json") or {}).get("files")):
        logger.warning("%s", line)
    write_json_atomic(store.loc("inputs.json"), {"files": admission.fingerprints})
    logger.info("admission: %d input rows, %d distinct valid keys, %d to generate, %d rejects "
                "(%d new), table %d bytes, %.1f s", admission.total, admission.valid_keys,
                len(admission.table), admission.rejects, admission.new_rejects,
                admission.table.nbytes, time.monotonic() - started)
    return admission


def _classify_failure(exc: BaseException, stop_exc: type) -> tuple[str, Optional[str]]:
    """(status, error message): a wrapped stop signal is a stop, not a failure."""
    from jobs.retry import CircuitOpen
    if find_cause(exc, stop_exc) or find_cause(exc, KeyboardInterrupt):
        return "stopped", None
    breaker = find_cause(exc, CircuitOpen)
    error = str(breaker) if breaker else f"{type(exc).__name__}: {exc}"
    logger.error("run failed: %s", error)
    return "failed", error


def _execute(cfg: RunConfig, store: RunStore, total: int, stop_exc: type,
             build: Callable, cleanup: Optional[Callable]) -> Summary:
    """Stream the dataset into the run, with progress.json around it."""
    import time

    from jobs import pipeline
    from jobs.job_metrics import JobGauges
    from jobs.progress import ProgressTracker

    progress = ProgressTracker(store, total, cfg.job.run_name, cfg.engine.model_name,
                               cfg.job.progress_interval_s,
                               JobGauges(cfg.job.run_name, cfg.engine.model_name)).start()
    status, error = "failed", None
    try:
        pipeline.write(build(), cfg, store.uri)
        status = "succeeded"
    except (stop_exc, KeyboardInterrupt):  # `ray job stop` (SIGTERM) or Ctrl-C
        status = "stopped"
    except Exception as exc:  # noqa: BLE001 - reported below with the cause
        status, error = _classify_failure(exc, stop_exc)
    finally:
        snap = progress.stop(status)
        if cleanup:
            cleanup()
        time.sleep(cfg.job.metrics_linger_s)  # let Prometheus scrape the final gauges
    if snap["failed"] and status == "succeeded":
        logger.warning("%d rows failed; see %s/failures/ and rerun with --retry-failed",
                       snap["failed"], store.uri)
    text = summary_text(store, snap)
    text += _report(store)
    if error:
        raise RunError(f"{error}\n{text}")
    return Summary(status, snap, text)
