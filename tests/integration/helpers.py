"""Helpers shared by integration tests: a test run's config and prompts, run a job
in-process, read a run back, reach the engines behind a Serve app."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd
import yaml
from ray import serve

from jobs.config import StorageConfig, parse_config
from jobs.pipeline.settings import RunMode
from jobs.runs.run import Summary, run_job
from jobs.io.run_store import RunStore

BUCKET = "raygen-test"
FAST_SIM = {"time_scale": 0.002, "accept_length": 3.0}
# Runs slow enough to interrupt mid-way (kills, SIGTERM, outages) share one app of their
# own: switching the default app's engine settings back and forth would redeploy it.
SLOW_APP = "raygen-slow"
SLOW_ENGINE = {"simulator": {"time_scale": 0.01}}


def run_config(tmp_path: Path, s3_endpoint: str, *, rows_file: str, run_name: str = "",
               app_name: str = "raygen-test", output: str = "", **sections: Any) -> dict:
    """A RunConfig tree for tests: simulator engines, fast time scale, S3 output."""
    tree: dict[str, Any] = {
        "engine": {"kind": "simulator", "model_path": "sim-test", "context_length": 16384,
                   "max_running_requests": 32, "start_timeout_s": 60,
                   "request_timeout_s": 120,
                   "speculative": {"algorithm": "NEXTN"}, "simulator": dict(FAST_SIM)},
        "serve": {"app_name": app_name, "max_ongoing_requests": 128,
                  "num_cpus_per_replica": 0.1, "health_check_period_s": 1,
                  "health_check_timeout_s": 5,
                  "autoscaling": {"min_replicas": 2, "max_replicas": 2,
                                  "target_ongoing_requests": 32}},
        "job": {"input": rows_file, "output": output or f"s3://{BUCKET}/runs",
                "run_name": run_name or f"t-{uuid.uuid4().hex[:8]}",
                "max_new_tokens": 4096, "batch_size": 16, "rows_per_file": 64,
                "inflight_rows_per_actor": 96, "max_actors": 1,
                "progress_interval_s": 1, "metrics_linger_s": 0,
                # tests feed many bad lines to few rows on purpose; test_dry_run.py
                # tests the guard itself
                "max_reject_fraction": 1.0,
                "retries": {"max_attempts": 3, "backoff_initial_s": 0.05,
                            "backoff_max_s": 0.2}},
        "storage": {"endpoint_url": s3_endpoint},
    }
    for section, values in sections.items():
        tree[section] = _merge(tree.get(section, {}), values)
    return tree


def sglang_config(tmp_path: Path, s3_endpoint: str, *, rows_file: str, model_path: str,
                  **sections: Any) -> dict:
    """A RunConfig tree on SGLang's real CPU engine (tests/support/sglang_cpu.py): the
    shared pool's engine and app, greedy sampling, a budget the scripted model's 38-token
    answer fits in. ``sections`` as in run_config, but the engine section is the pool's
    (another one would redeploy the pool)."""
    from tests.support import sglang_cpu
    engine = sglang_cpu.engine_section(model_path, **sections.pop("engine", {}))
    sections["job"] = _merge({"max_new_tokens": 64, "sampling": {"temperature": 0.0}},
                             sections.get("job", {}))
    # A busy real engine on a loaded 2-core machine answers /health in seconds, not the
    # simulator's milliseconds: at the simulator tier's 5 s, Serve once replaced the sound
    # engine of the pool while the other was being replaced (both down for 4.5 min). A
    # dead engine is still found at once (check_health sees its process gone). Every
    # check of a real engine is a generation (SGLang's /health): every 2 s, not 1 s.
    sections["serve"] = _merge({"health_check_timeout_s": 30, "health_check_period_s": 2},
                               sections.get("serve", {}))
    tree = run_config(tmp_path, s3_endpoint, rows_file=rows_file, app_name=sglang_cpu.APP,
                      **sections)
    tree["engine"] = engine
    return tree


def sglang_spec_config(tmp_path: Path, s3_endpoint: str, *, rows_file: str, model_path: str,
                       draft_path: str, **sections: Any) -> dict:
    """``sglang_config`` on the speculative pool: its own app of one replica, whose engine
    drafts with the ``draft`` model (tests/support/sglang_cpu.py spec_engine_section)."""
    from tests.support import sglang_cpu
    engine = sglang_cpu.spec_engine_section(model_path, draft_path, **sections.pop("engine", {}))
    sections["serve"] = _merge({"app_name": sglang_cpu.SPEC_APP,
                                "autoscaling": {"min_replicas": 1, "max_replicas": 1}},
                               sections.get("serve", {}))
    tree = sglang_config(tmp_path, s3_endpoint, rows_file=rows_file, model_path=model_path,
                         **sections)
    tree["engine"] = engine
    return tree


def sglang_small_pool_config(tmp_path: Path, s3_endpoint: str, *, rows_file: str,
                             model_path: str, **sections: Any) -> dict:
    """``sglang_config`` on the small pool: its own app of one replica, whose engine's KV
    pool is too small for the rows (tests/support/sglang_cpu.py small_pool_engine_section)."""
    from tests.support import sglang_cpu
    sections["serve"] = _merge({"app_name": sglang_cpu.SMALL_POOL_APP,
                                "autoscaling": {"min_replicas": 1, "max_replicas": 1}},
                               sections.get("serve", {}))
    tree = sglang_config(tmp_path, s3_endpoint, rows_file=rows_file, model_path=model_path,
                         **sections)
    tree["engine"] = sglang_cpu.small_pool_engine_section(model_path)
    return tree


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(
            out.get(key), dict) else value
    return out


def write_prompts(path: Path, n: int, start: int = 0, with_ids: bool = True,
                  extra_lines: list[str] | None = None) -> Path:
    cats = ["coding", "reasoning", "multi_turn", "tool_calling"]
    with open(path, "w") as f:
        for i in range(start, start + n):
            row: dict[str, Any] = {
                "category": cats[i % len(cats)],
                "messages": [{"role": "user", "content": f"Prompt {i}: explain step {i % 7} "
                              f"of problem {i * 7919 % 1000} in detail."}]}
            if with_ids:
                row["id"] = f"p{i:05d}"
            f.write(json.dumps(row) + "\n")
        for line in extra_lines or []:
            f.write(line + "\n")
    return path


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


def generate_cmd(path, tree: dict) -> list[str]:
    """`python -m jobs.generate --config PATH` for the config ``tree`` (written to PATH):
    a driver of its own, for tests that kill one."""
    return [sys.executable, "-m", "jobs.generate", "--config", str(write_yaml(path, tree))]


def generate_main(argv: list[str]) -> int:
    """`python -m jobs.generate ARGV` in this process (its exit code): the CLI as users run
    it, without an interpreter start and a Ray job of its own, for tests whose driver is
    not the one killed. The SIGTERM handler it installs is put back."""
    from jobs import generate
    old = signal.getsignal(signal.SIGTERM)
    try:
        return generate.main(argv)
    finally:
        signal.signal(signal.SIGTERM, old)


def deploy(tree: dict) -> None:
    """Deploy (or attach to) the config's Serve app before a test pokes its engines."""
    from serve_apps.app import deploy_or_attach
    cfg = parse_config(tree)
    deploy_or_attach(cfg.engine, cfg.serve)


def replica_infos(app_name: str, replicas: int, timeout_s: float = 60,
                  where: Callable[[dict], bool] = lambda info: True) -> dict[str, dict]:
    """replica id -> its info(), asking the app until ``replicas`` replicas for which
    ``where(info)`` holds have answered (Serve routes each call to one of them)."""
    handle = serve.get_app_handle(app_name)
    seen: dict[str, dict] = {}
    deadline = time.monotonic() + timeout_s
    while len(seen) < replicas and time.monotonic() < deadline:
        info = handle.info.remote().result()
        if where(info):
            seen[info["replica"]] = info
    assert len(seen) >= replicas, f"found replicas {sorted(seen)}"
    return seen


def engine_urls(app_name: str, replicas: int, timeout_s: float = 60) -> list[str]:
    return sorted(i["engine_url"] for i in replica_infos(app_name, replicas, timeout_s).values())


def set_faults(urls: list[str], **faults: Any) -> None:
    for url in urls:
        req = urllib.request.Request(f"{url}/sim/faults", data=json.dumps(faults).encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()


CLEAR_FAULTS = {"error_rate": 0.0, "slow_rate": 0.0, "error_status": 500, "broken_output": ""}


# How much slower a run to be killed mid-way decodes (simulator slow faults): a 240-row
# session then spans several seconds of generation, so "half done" is still mid-run.
KILLABLE_SLOWDOWN = 25.0


@contextlib.contextmanager
def slowed(tree: dict, factor: float = KILLABLE_SLOWDOWN, replicas: int = 2) -> Iterator[list[str]]:
    """The config's engines decode ``factor`` times slower for every request that arrives
    inside the block (the simulator draws slowness per request): a driver to be killed
    is still mid-run when the test sees the moment it waits for, and the resume after the
    block runs at full speed."""
    deploy(tree)
    app = tree["serve"]["app_name"]
    urls = engine_urls(app, replicas)
    set_faults(urls, slow_rate=1.0, slow_factor=factor)
    try:
        yield urls
    finally:
        set_faults(engine_urls(app, replicas), **CLEAR_FAULTS)


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
