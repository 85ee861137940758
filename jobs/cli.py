"""`raygen`: one command for a run's whole life, over the `python -m jobs.X` modules.

Design decisions:
- Each subcommand's options are defined once, by its module (``add_args``), and run by
  it (``run``): `raygen status ...` and `python -m jobs.analysis.status ...` are built from
  the same functions, so they can never differ (tests/unit/jobs/test_cli.py compares
  every subcommand's flags). `raygen continue` is `python -m jobs.generate
  --continue-truncated` with the continuation's options only.
- Run readers take the run URI, or derive it from --config (<job.output>/<job.run_name>);
  with both, the URI names the run and the config only supplies storage settings (how
  a pilot run, <run>-pilot, is read with its parent's config).
- Exit codes: 0 done; 1 the run failed or a run/storage problem (one line on stderr);
  2 bad usage or an invalid config. No traceback for what an operator can fix.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional

EXIT_CODES = """exit codes:
  0  done
  1  the run failed, or the run/storage could not be read or written (one line on stderr)
  2  bad usage or invalid config"""

COMMANDS = {  # name: (one-line help, examples)
    "generate": ("start or resume a run (the same command resumes)",
                 ["raygen generate --config jobs/configs/demo.yaml",
                  "raygen generate --config FILE --set job.max_new_tokens=8192",
                  "raygen generate --config FILE --retry-failed",
                  "raygen generate --config FILE --regenerate-flagged",
                  "raygen generate --config FILE --dry-run",
                  "raygen generate --config FILE --pilot 500 --set job.max_new_tokens=16384"]),
    "continue": ("continue truncated rows token-exactly up to a larger total budget",
                 ["raygen continue --config FILE --max-total-tokens 8192"]),
    "status": ("show a run's progress (counts, rate, ETA)",
               ["raygen status --config FILE", "raygen status s3://bucket/runs/demo"]),
    "report": ("end-of-run report, with what-if forecasts per cap",
               ["raygen report --config FILE --what-if 5120,6144,8192",
                "raygen report --config NEW.yaml --compare s3://bucket/runs/baseline"]),
    "finalize": ("write <run>/final/: one row per prompt + manifest.json",
                 ["raygen finalize --config FILE"]),
    "tune": ("sweep one engine of the config on the run's prompts; recommend its running "
             "cap and rows in flight",
             ["raygen tune --config jobs/configs/demo-sim.yaml --point-seconds 10",
              "raygen tune --config FILE --concurrency 16,32,48,64 --caps 48,64"]),
    "export": ("export the latest rows as drafter training data",
               ["raygen export --config FILE --format pretokenized --out s3://bucket/exports/demo",
                "raygen export RUN --format messages --out ./demo-sft --file-type parquet "
                "--include-truncated --max-length 16384"]),
}


# name -> (module, the function adding its options), for every subcommand
MODULES = {"generate": ("jobs.generate", "add_args"),
           "continue": ("jobs.generate", "add_continue_args"),
           "status": ("jobs.analysis.status", "add_args"),
           "report": ("jobs.analysis.report", "add_args"),
           "finalize": ("jobs.analysis.finalize", "add_args"),
           "export": ("jobs.analysis.export", "add_args"),
           "tune": ("jobs.tune.command", "add_args")}


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raygen", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Generate LLM completions for a prompt dataset on a Ray cluster, then "
                    "inspect, finalize and export the run.",
        epilog="examples:\n  " + "\n  ".join(e for _, (_, ex) in COMMANDS.items()
                                             for e in ex[:1])
               + "\n\nrun `raygen COMMAND --help` for a command's options.\n\n" + EXIT_CODES)
    subs = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (summary, examples) in COMMANDS.items():
        sub = subs.add_parser(
            name, help=summary, description=summary + ".",
            epilog="examples:\n  " + "\n  ".join(examples) + "\n\n" + EXIT_CODES,
            formatter_class=argparse.RawDescriptionHelpFormatter)
        module, add = MODULES[name]
        getattr(importlib.import_module(module), add)(sub)
        sub.set_defaults(module=module)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return importlib.import_module(args.module).run(args)
    except SystemExit as exc:  # the modules' one-line errors exit 1 (or 2) via run_cli
        return exc.code if isinstance(exc.code, int) else 1
    except (OSError, ValueError) as exc:  # storage unreachable, bad URI: one line
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
