"""Entry point: ``python -m jobs.generate --config FILE [--set key=value ...]``.

config -> deploy (or attach to) the engine app -> read what the run already holds ->
stream read/validate/admit/generate/write -> progress.json -> summary. Rerunning the
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


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m jobs.generate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="run YAML (see jobs/configs/)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set job.max_new_tokens=8192")
    parser.add_argument("--retry-failed", action="store_true",
                        help="reprocess only the rows in <run>/failures/ without a result")
    parser.add_argument("--continue-truncated", action="store_true",
                        help="continue every length-truncated row token-exactly")
    parser.add_argument("--max-total-tokens", type=int, default=None,
                        help="with --continue-truncated: the new total output budget")
    parser.add_argument("--check-context", action="store_true",
                        help="only count prompts that cannot get their full budget within the "
                        "engine's context length (writes <run>/context_check.json)")
    parser.add_argument("--pilot", type=int, default=None, metavar="N",
                        help="run ~N prompts stratified by category as <run>-pilot (use a "
                        "high --set job.max_new_tokens) and report the what-if per cap")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate config and input and print what would run (rows, "
                        "rejects, done, to generate, budget, replicas); deploys and writes "
                        "nothing; exit 1 if the reject check would stop the run")
    return parser.parse_args(argv)


# --dry-run plans a plain or --retry-failed run; these modes deploy engines to plan.
DRY_RUN_CONFLICTS = ("continue_truncated", "check_context", "pilot", "max_total_tokens")


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


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = parse_args(argv)
    conflict = dry_run_conflict(args)
    if conflict:
        print(f"error: {conflict}", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, args.set)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from jobs.pipeline.settings import RunMode  # heavy imports only after the config
    from jobs.runs.run import RunError, dry_run, run_job
    mode = RunMode.of_flags(args.retry_failed, args.continue_truncated, args.max_total_tokens,
                            args.pilot)
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
        from jobs.runs.pilot import pilot_config
        cfg = pilot_config(cfg, mode.pilot_rows)
    try:
        summary = run_job(cfg, mode, stop_exc=Stopped, check_context=args.check_context)
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(summary.text)
    return 0 if summary.status == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
