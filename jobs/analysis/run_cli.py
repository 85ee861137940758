"""What the run-level commands (status, report, finalize, export) share: how to open a run.

    python -m jobs.analysis.<command> [<run>] [--config FILE]   (= raygen <command> ...)

Design decisions:
- A run is addressed by its URI (a local path or s3://bucket/prefix/run), not by a
  config: the run's files are the truth, and a run can be inspected from a laptop that
  never had the job's config.
  Without a run URI, `--config FILE` names it (<job.output>/<job.run_name>).
- Storage settings come from `--config FILE` (only its `storage` section is read and
  validated, so a config whose job section points at files absent here still works), or
  else from the environment the Makefile and the job use: RAYGEN_S3_ENDPOINT and
  AWS_DEFAULT_REGION. Credentials always come from the AWS credential chain.
- Errors an operator can fix end the command with one line saying what to do, not a
  traceback: exit 1 for a run or storage problem (`fail`), exit 2 for bad usage, e.g.
  neither a run URI nor --config, or an invalid config naming the run (`usage_error`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn, Optional

import yaml
from pydantic import ValidationError

from jobs.config import ConfigError, StorageConfig, load_config
from jobs.io.run_store import RunStore
from jobs.io.storage import list_files


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(1)


def usage_error(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def add_run_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", nargs="?", default=None,
                        help="the run: a local folder or s3://bucket/prefix/<run_name> "
                             "(default: the one --config names)")
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="the run's YAML: names the run (without a run URI) and its "
                             "`storage` section says how to reach S3 (default: env "
                             "RAYGEN_S3_ENDPOINT / AWS_DEFAULT_REGION)")


def run_uri(args: argparse.Namespace) -> str:
    """The run URI given, or the one the config names (<job.output>/<job.run_name>)."""
    if args.run:
        return args.run
    if not args.config:
        usage_error("give the run URI or --config FILE")
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        usage_error(" ".join(str(exc).split()))
    return cfg.job.output.rstrip("/") + "/" + cfg.job.run_name


def open_args(args: argparse.Namespace) -> RunStore:
    """The run the parsed arguments name (add_run_args), with its storage settings."""
    return open_run(run_uri(args), args.config)


def storage_settings(config_path: Optional[str]) -> StorageConfig:
    if config_path is None:
        return StorageConfig(endpoint_url=os.environ.get("RAYGEN_S3_ENDPOINT") or None,
                             region=os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")
    try:
        tree = yaml.safe_load(Path(config_path).read_text()) or {}
    except FileNotFoundError:
        fail(f"config file not found: {config_path}")
    except yaml.YAMLError as exc:
        fail(f"{config_path} is not valid YAML: {exc}")
    section = (tree.get("storage") or {}) if isinstance(tree, dict) else None
    if not isinstance(section, dict):
        fail(f"{config_path}: `storage` must be a mapping (endpoint_url, region)")
    try:
        return StorageConfig.model_validate(section)
    except ValidationError as exc:
        problems = "; ".join(f"storage.{'.'.join(map(str, e['loc']))}: {e['msg']}"
                             for e in exc.errors())
        fail(f"{config_path}: {problems}")


def open_run(run_uri: str, config_path: Optional[str] = None) -> RunStore:
    """The RunStore for a run URI, with storage settings from the config or the env."""
    try:
        return RunStore(run_uri, storage_settings(config_path))
    except ValueError as exc:  # an unsupported URI scheme
        fail(str(exc))


def require_run(store: RunStore, what: str = "") -> None:
    """Exit 1 unless the URI holds a run (progress.json or any data/failures/rejects);
    ``what``: the option that named it, said first (e.g. "--compare")."""
    said = f"{what}: " if what else ""
    try:
        if store.read_json("progress.json") is not None:
            return
        if any(list_files(store.loc(kind), ".parquet")
               for kind in ("data", "failures", "rejects")):
            return
    except OSError as exc:  # unreachable endpoint, no credentials, no bucket
        fail(f"{said}cannot read {store.uri}: {exc}")
    fail(f"{said}no run at {store.uri} (no progress.json, data/, failures/ or rejects/); "
         f"check the path: it is <job.output>/<job.run_name>")
