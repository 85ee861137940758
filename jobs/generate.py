"""Entry point: ``python -m jobs.generate --config FILE [--set key=value ...]``.

config (an error exits 2 before Ray is imported) -> with --pilot: write the pilot's
sample and switch to the run <run>-pilot -> take the run's lease (one job per run) ->
read what the run already holds (its run index) -> plan the session (the admission
pass reads and validates the input and writes its rejects; --continue-truncated picks
the truncated rows) -> start Ray, claim the Serve app, deploy (or attach to) the
engine -> stream read/validate/admit/generate/write, progress.json rewritten meanwhile
-> final status in progress.json -> summary and report -> release the lease.
--dry-run stops after the plan (no Ray, no lease, no writes); --check-context deploys
the engine and counts prompts against its context, without the lease. Rerunning the
same command resumes: only prompts without a durable result are sent.
Also runs under ``ray job submit --working-dir . -- python -m jobs.generate ...``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Optional

from jobs.config import ConfigError, load_config

logger = logging.getLogger("raygen")


def _add_job_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE",
                        help="run YAML (see jobs/configs/)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set job.max_new_tokens=8192")


def add_args(parser: argparse.ArgumentParser) -> None:
    """The options of `python -m jobs.generate` and `raygen generate` (one definition)."""
    _add_job_args(parser)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--retry-failed", action="store_true",
                      help="reprocess only the rows in <run>/failures/ without a result")
    mode.add_argument("--continue-truncated", action="store_true",
                      help="continue every length-truncated row token-exactly (with "
                           "--max-total-tokens)")
    mode.add_argument("--check-context", action="store_true",
                      help="only count prompts that cannot get their full budget within the "
                           "engine's context length (writes <run>/context_check.json)")
    mode.add_argument("--regenerate-flagged", action="store_true",
                      help="send again, as new versions of their keys, every latest row "
                           "with integrity flags and every row a drained replica condemned "
                           "(these follow any session that succeeds by themselves)")
    mode.add_argument("--pilot", type=int, default=None, metavar="N",
                      help="run ~N prompts stratified by category as <run>-pilot (use a "
                           "high --set job.max_new_tokens) and report the what-if per cap")
    parser.add_argument("--max-total-tokens", type=int, default=None, metavar="N",
                        help="with --continue-truncated: the new total output budget per row")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate config and input and print what would run (rows, "
                             "rejects, done, to generate, budget, replicas); deploys and "
                             "writes nothing; exit 1 if the reject check would stop the run")


def add_continue_args(parser: argparse.ArgumentParser) -> None:
    """`raygen continue`: `python -m jobs.generate --continue-truncated`, same definitions."""
    _add_job_args(parser)
    parser.add_argument("--max-total-tokens", type=int, required=True, metavar="N",
                        help="the new total output budget per row")
    parser.set_defaults(continue_truncated=True, retry_failed=False, check_context=False,
                        pilot=None, dry_run=False, regenerate_flagged=False)


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m jobs.generate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(parser)
    return parser.parse_args(argv)


# --dry-run plans a plain or --retry-failed run; these modes deploy engines to plan.
DRY_RUN_CONFLICTS = ("continue_truncated", "check_context", "pilot", "max_total_tokens",
                     "regenerate_flagged")


def dry_run_conflict(args: argparse.Namespace) -> Optional[str]:
    used = [name for name in DRY_RUN_CONFLICTS if getattr(args, name) not in (None, False)]
    if not args.dry_run or not used:
        return None
    return (f"--dry-run cannot be combined with --{used[0].replace('_', '-')}: it plans a "
            f"plain or --retry-failed run")


class Stopped(BaseException):
    """SIGTERM (e.g. `ray job stop`): stop cleanly, keep everything written.

    A BaseException, like KeyboardInterrupt, so no library's `except Exception` can
    swallow or re-wrap it on its way out of the streaming executor.
    """


def _on_sigterm(*_):
    raise Stopped()


def _leave_now(code: int) -> None:
    """Exit without waiting on a store we cannot reach (see RunError.fenced)."""
    import os

    import ray
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    ray.shutdown()  # the driver's own Ray state goes cleanly; only S3's finalizer is skipped
    os._exit(code)


def follow_up(cfg, mode, summary, run_job, stop_exc):
    """The session's summary, then (job.regenerate every_turn) the rounds of the open
    conversations (jobs/runs/turn_rounds.py), then regenerate sessions while drained
    replicas' condemned rows remain (jobs/runs/regenerate.py)."""
    # local: pulls in pyarrow and pandas, after a session only (jobs.generate stays light:
    # tests/contract/jobs/test_lazy_imports.py)
    from jobs.io.run_store import RunStore
    from jobs.pipeline.settings import (NEXT_TURN, REGENERATE, RunMode,  # local: as above
                                        StageSettings)
    from jobs.runs import regenerate, turn_rounds  # local: as above
    strategy = mode.strategy  # what follows the session is its mode's (jobs/pipeline/modes.py)
    if strategy.says_regenerated:
        summary.text += "\n" + regenerate.session_line(summary.progress)
    store = RunStore.for_run(cfg.job.output, cfg.job.run_name, cfg.storage)
    if cfg.job.regenerate == "every_turn" and strategy.then_rounds:
        summary = turn_rounds.rounds(
            store, summary, StageSettings.of(cfg).settings_hash,
            lambda: run_job(cfg, RunMode(NEXT_TURN), stop_exc=stop_exc))
        # condemned rows: not regenerated in every-turn runs (plans.plan)
    else:
        def session():
            done = run_job(cfg, RunMode(REGENERATE), stop_exc=stop_exc)
            done.text += "\n" + regenerate.session_line(done.progress)
            return done
        summary = regenerate.follow_up(store, summary, session)
    line = regenerate.flagged_line(summary.progress)  # the last session's end: what is left
    if line and summary.status == "succeeded":
        summary.text += "\n" + line
    return summary


def main(argv: Optional[list[str]] = None) -> int:
    return run(parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """One session from parsed options (`python -m jobs.generate`, `raygen generate|continue`)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    conflict = dry_run_conflict(args)
    if conflict:
        print(f"error: {conflict}", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, args.set)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # local: heavy imports (pyarrow, ray) only after the config is valid (jobs.generate stays
    # light: tests/contract/jobs/test_lazy_imports.py)
    from jobs.pipeline.settings import RunMode
    from jobs.runs.run import RunError, dry_run, run_job  # local: as above
    mode = RunMode.of_flags(args.retry_failed, args.continue_truncated, args.max_total_tokens,
                            args.pilot, args.regenerate_flagged)
    if args.dry_run:
        try:
            summary = dry_run(cfg, mode)
        except RunError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(summary.text)
        return 0
    signal.signal(signal.SIGTERM, _on_sigterm)  # until Ray starts; jobs/runs/run.py re-installs
    if mode.pilot_rows:
        from jobs.runs.pilot import pilot_config  # local: pulls in ray, as above
        cfg = pilot_config(cfg, mode.pilot_rows)
    try:
        summary = run_job(cfg, mode, stop_exc=Stopped, check_context=args.check_context)
        if not args.check_context:  # rows drained replicas condemned: regenerated now
            summary = follow_up(cfg, mode, summary, run_job, Stopped)
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if exc.fenced:  # this process has nothing left to do but wait on the store
            _leave_now(1)
        return 1
    print(summary.text)
    return 0 if summary.status == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
