"""`raygen`: one command for a run's whole life, over the `python -m jobs.X` modules.

Design decisions:
- Each subcommand parses its own short, user-facing options, then hands a built
  argument list to the module that does the work (jobs.generate, status, report,
  finalize, export): those stay the one implementation and keep working on their own.
- Run readers take the run URI, or derive it from --config (<job.output>/<job.run_name>);
  with both, the URI names the run and the config only supplies storage settings (how
  a pilot run, <run>-pilot, is read with its parent's config).
- Exit codes: 0 done; 1 the run failed or a run/storage problem (one line on stderr);
  2 bad usage or an invalid config. No traceback for what an operator can fix.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Optional

EXIT_CODES = """exit codes:
  0  done
  1  the run failed, or the run/storage could not be read or written (one line on stderr)
  2  bad usage or invalid config"""

COMMANDS = {  # name: (one-line help, examples)
    "generate": ("start or resume a run (the same command resumes)",
                 ["raygen generate --config jobs/configs/demo.yaml",
                  "raygen generate --config FILE --set job.max_new_tokens=8192",
                  "raygen generate --config FILE --retry-failed",
                  "raygen generate --config FILE --dry-run",
                  "raygen generate --config FILE --pilot 500 --set job.max_new_tokens=16384"]),
    "continue": ("continue truncated rows token-exactly up to a larger total budget",
                 ["raygen continue --config FILE --max-total-tokens 8192"]),
    "status": ("show a run's progress (counts, rate, ETA)",
               ["raygen status --config FILE", "raygen status s3://bucket/runs/demo"]),
    "report": ("end-of-run report, with what-if forecasts per cap",
               ["raygen report --config FILE --what-if 5120,6144,8192"]),
    "finalize": ("write <run>/final/: one row per prompt + manifest.json",
                 ["raygen finalize --config FILE"]),
    "export": ("export the latest rows as drafter training data",
               ["raygen export --config FILE --format pretokenized --out s3://bucket/exports/demo",
                "raygen export RUN --format messages --out ./demo-sft --file-type parquet "
                "--include-truncated --max-length 16384"]),
}


def usage_error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _subparser(subs, name: str) -> argparse.ArgumentParser:
    summary, examples = COMMANDS[name]
    return subs.add_parser(
        name, help=summary, description=summary + ".",
        epilog="examples:\n  " + "\n  ".join(examples) + "\n\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter)


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", nargs="?", default=None,
                   help="the run: a local folder or s3://bucket/prefix/<run_name> "
                        "(default: derived from --config)")
    p.add_argument("--config", metavar="FILE", default=None,
                   help="the run's YAML: gives the run URI and the S3 settings")


def _job_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", required=True, help="the run's YAML")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set job.max_new_tokens=8192")


def build_parser() -> argparse.ArgumentParser:
    from jobs.analysis.export import add_export_args
    from jobs.analysis.report import parse_caps
    parser = argparse.ArgumentParser(
        prog="raygen", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Generate LLM completions for a prompt dataset on a Ray cluster, then "
                    "inspect, finalize and export the run.",
        epilog="examples:\n  " + "\n  ".join(e for _, (_, ex) in COMMANDS.items()
                                             for e in ex[:1])
               + "\n\nrun `raygen COMMAND --help` for a command's options.\n\n" + EXIT_CODES)
    subs = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    gen = _subparser(subs, "generate")
    _job_args(gen)
    mode = gen.add_mutually_exclusive_group()
    mode.add_argument("--retry-failed", action="store_true",
                      help="redo only the rows in <run>/failures/")
    mode.add_argument("--check-context", action="store_true",
                      help="only count prompts that cannot get their full budget (generates "
                           "nothing)")
    mode.add_argument("--pilot", type=int, metavar="N",
                      help="run ~N prompts as <run>-pilot and report the what-if per cap")
    gen.add_argument("--dry-run", action="store_true",
                     help="check config and input, print what would run; deploys and writes "
                          "nothing (plain or with --retry-failed)")

    cont = _subparser(subs, "continue")
    _job_args(cont)
    cont.add_argument("--max-total-tokens", type=int, required=True, metavar="N",
                      help="the new total output budget per row")

    for name in ("status", "report", "finalize", "export"):
        _run_args(sub := _subparser(subs, name))
        if name == "report":
            sub.add_argument("--what-if", type=parse_caps, metavar="CAPS",
                             help="caps to forecast, e.g. 5120,6144,8192")
        if name == "finalize":
            sub.add_argument("--force", action="store_true",
                             help="finalize even though the run says it is running")
            sub.add_argument("--rows-per-file", type=int, metavar="N",
                             help="rows per final part file")
        if name == "export":
            add_export_args(sub)
    return parser


def run_uri(args: argparse.Namespace) -> Optional[str]:
    """The run URI given, or the one the config names; None after printing why not."""
    if args.run:
        return args.run
    if not args.config:
        usage_error(f"raygen {args.command}: give the run URI or --config FILE")
        return None
    from jobs.config import ConfigError, load_config
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        usage_error(one_line(exc))
        return None
    return cfg.job.output.rstrip("/") + "/" + cfg.job.run_name


def _job_argv(args: argparse.Namespace) -> list[str]:
    return ["--config", args.config] + [x for s in args.set for x in ("--set", s)]


def _generate(args: argparse.Namespace) -> int:
    from jobs import generate
    argv = _job_argv(args)
    if args.retry_failed:
        argv.append("--retry-failed")
    if args.check_context:
        argv.append("--check-context")
    if args.pilot is not None:
        argv += ["--pilot", str(args.pilot)]
    if args.dry_run:
        argv.append("--dry-run")  # jobs.generate refuses it with --check-context/--pilot
    return generate.main(argv)


def _continue(args: argparse.Namespace) -> int:
    from jobs import generate
    return generate.main(_job_argv(args) + ["--continue-truncated", "--max-total-tokens",
                                            str(args.max_total_tokens)])


def _reader(name: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        uri = run_uri(args)
        if uri is None:
            return 2
        argv = [uri] + (["--config", args.config] if args.config else [])
        if name == "export":
            from jobs.analysis.export import run_export
            args.run = uri
            return run_export(args)
        if name == "report" and args.what_if:
            argv += ["--what-if", ",".join(map(str, args.what_if))]
        if name == "finalize":
            argv += (["--force"] if args.force else []) + (
                ["--rows-per-file", str(args.rows_per_file)] if args.rows_per_file else [])
        module = __import__(f"jobs.analysis.{name}", fromlist=["main"])
        return module.main(argv)
    return run


HANDLERS = {"generate": _generate, "continue": _continue,
            **{name: _reader(name) for name in ("status", "report", "finalize", "export")}}


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return HANDLERS[args.command](args)
    except SystemExit as exc:  # the modules' one-line errors exit 1 via run_cli.fail
        return exc.code if isinstance(exc.code, int) else 1
    except (OSError, ValueError) as exc:  # storage unreachable, bad URI: one line
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
