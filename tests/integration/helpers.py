"""Helpers shared by integration tests: run a job in-process, read a run back, reach
the engines behind a Serve app."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pandas as pd
import yaml
from ray import serve

from jobs.config import StorageConfig, parse_config
from jobs.pipeline.settings import RunMode
from jobs.runs.run import Summary, run_job
from jobs.io.run_store import RunStore


class NeverRaised(Exception):
    pass


def run(tree: dict, check_context: bool = False, **flags: Any) -> Summary:
    """One session; ``flags`` are RunMode.of_flags's (the jobs.generate flags)."""
    return run_job(parse_config(tree), RunMode.of_flags(**flags), stop_exc=NeverRaised,
                   check_context=check_context)


def store_of(tree: dict) -> RunStore:
    storage = StorageConfig(**tree["storage"])
    return RunStore.for_run(tree["job"]["output"], tree["job"]["run_name"], storage)


def read(tree: dict, kind: str) -> pd.DataFrame:
    return store_of(tree).read_kind(kind).to_pandas()


def write_yaml(path, tree: dict):
    path.write_text(yaml.safe_dump(tree))
    return path


def deploy(tree: dict) -> None:
    """Deploy (or attach to) the config's Serve app before a test pokes its engines."""
    from serve_apps.app import deploy_or_attach
    cfg = parse_config(tree)
    deploy_or_attach(cfg.engine, cfg.serve)


def engine_urls(app_name: str, replicas: int, timeout_s: float = 60) -> list[str]:
    handle = serve.get_app_handle(app_name)
    urls: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while len(urls) < replicas and time.monotonic() < deadline:
        urls.add(handle.info.remote().result()["engine_url"])
    assert len(urls) == replicas, f"found engines {urls}"
    return sorted(urls)


def set_faults(urls: list[str], **faults: Any) -> None:
    for url in urls:
        req = urllib.request.Request(f"{url}/sim/faults", data=json.dumps(faults).encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()


CLEAR_FAULTS = {"error_rate": 0.0, "slow_rate": 0.0, "error_status": 500}


def run_with_faults(tree: dict, app_name: str, replicas: int = 2, **faults: Any) -> Summary:
    """Deploy the config's app, switch the engines' faults on, run, switch them off."""
    deploy(tree)
    urls = engine_urls(app_name, replicas)
    try:
        set_faults(urls, **faults)
        return run(tree)
    finally:
        set_faults(urls, **CLEAR_FAULTS)


def assert_run_exact(tree: dict, keys, bad_lines=()) -> None:
    """The run is exact: every expected key in data/ exactly once (per version), every
    part readable, rejects/ holds exactly ``bad_lines`` (each once), no open failures.
    ``keys``: the keys of every valid prompt; ``bad_lines``: the raw text of every line
    that must be a reject (invalid rows, later duplicates)."""
    from bench.chaos import exactness
    report = exactness(store_of(tree), keys, bad_lines)
    problems = {k: (v[:10] if isinstance(v, list) else v) for k, v in report.items() if v}
    assert not problems, f"run {tree['job']['run_name']} is not exact: {problems}"
