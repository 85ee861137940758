"""Chaos trials: ``kill -9`` random Ray worker processes of the job's data plane
(read / validate+admit tasks, generate actors, write tasks) during a run, rerun until
the run succeeds, then check the run is exact.

    python -m bench.chaos --trials 5 --prompts 300 --kills 6      # own moto S3 + Ray

prints one line per trial and a total "N trials, L lost, D duplicated, G good rows
rejected". Inside pytest (tests/integration/test_admission_faults.py) the same
:func:`chaos_trial` runs on the shared test cluster.

Only processes of THIS cluster are touched: the ``ray::`` process titles among the
descendants of the raylet that is a descendant of ``root_pid`` (the process that
started the local cluster); other Ray clusters on the machine are never candidates.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import psutil

# Ray Data names the workers after the operators in jobs/pipeline/chain.py.
DATA_PLANE = ("ReadPromptFiles", "validate_batch", "admit_batch", "GenerateRows", "Write")


def cluster_raylets(root_pid: int) -> list[psutil.Process]:
    root = psutil.Process(root_pid)
    return [p for p in root.children(recursive=True) if _name(p) == "raylet"]


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.Error:
        return ""


def _title(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline()).strip()
    except psutil.Error:
        return ""


def data_plane_workers(root_pid: int, stages: tuple[str, ...] = DATA_PLANE
                       ) -> list[tuple[int, str]]:
    """(pid, process title) of the data plane's Ray workers of the cluster under root_pid
    (those running one of ``stages``)."""
    return workers_below(cluster_raylets(root_pid), stages)


def workers_below(raylets: Iterable[psutil.Process], stages: tuple[str, ...] = DATA_PLANE
                  ) -> list[tuple[int, str]]:
    """(pid, process title) of the Ray workers below these raylets running one of
    ``stages`` (a cluster started by `ray start`, whose raylet no caller descends from,
    names its raylets itself: bench/soak.py)."""
    out = []
    for raylet in raylets:
        for proc in raylet.children(recursive=True):
            title = _title(proc)
            if title.startswith("ray::") and any(m in title for m in stages):
                out.append((proc.pid, title))
    return out


def _stage(title: str) -> str:
    return next(m for m in DATA_PLANE if m in title)


@dataclass
class Killer:
    """Kills a random data-plane worker every few seconds while ``budget`` lasts."""

    root_pid: int
    rng: random.Random
    budget: int
    interval_s: tuple[float, float] = (1.0, 3.0)
    stages: tuple[str, ...] = DATA_PLANE
    killed: list[str] = field(default_factory=list)
    # the candidates; default: the data-plane workers of the cluster under root_pid
    find: Optional[Callable[[], list[tuple[int, str]]]] = None

    def run(self, proc: subprocess.Popen) -> None:
        find = self.find or (lambda: data_plane_workers(self.root_pid, self.stages))
        while len(self.killed) < self.budget and proc.poll() is None:
            deadline = time.monotonic() + self.rng.uniform(*self.interval_s)
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.05)
            workers = []
            while not workers and proc.poll() is None:  # until one of the stages runs
                workers = find()
                time.sleep(0 if workers else 0.1)
            if not workers:
                break
            # a stage first, then one of its workers: short-lived write and validate
            # tasks get killed as often as the long-lived generate actors
            stages = sorted({_stage(t) for _, t in workers})
            stage = self.rng.choice(stages)
            pid, title = self.rng.choice(sorted(w for w in workers if _stage(w[1]) == stage))
            try:
                os.kill(pid, signal.SIGKILL)
                self.killed.append(title.split()[0])
            except ProcessLookupError:
                pass


def chaos_trial(cfg_path: Path, root_pid: int, seed: int, kills: int,
                max_attempts: int = 6, timeout_s: float = 600, kill_attempts: int = 2,
                log_dir: Optional[Path] = None, stages: tuple[str, ...] = DATA_PLANE,
                interval_s: tuple[float, float] = (1.0, 3.0)) -> dict[str, Any]:
    """Run ``jobs.generate`` on cfg_path, killing workers during the first attempts,
    and rerun until it exits 0. Returns kills, attempts and exit codes."""
    rng = random.Random(seed)
    cmd = [sys.executable, "-m", "jobs.generate", "--config", str(cfg_path)]
    codes, killed = [], []
    for attempt in range(max_attempts):
        log = open(log_dir / f"chaos-{seed}-{attempt}.log", "w") if log_dir else subprocess.DEVNULL
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        killer = Killer(root_pid, rng, kills - len(killed) if attempt < kill_attempts else 0,
                        interval_s, stages)
        thread = threading.Thread(target=killer.run, args=(proc,), daemon=True)
        thread.start()
        codes.append(proc.wait(timeout=timeout_s))
        thread.join()
        killed += killer.killed
        if codes[-1] == 0:
            break
    return {"seed": seed, "kills": killed, "attempts": len(codes), "exit_codes": codes}


def exactness(store, keys: Iterable[str], bad_lines: Iterable[str]) -> dict[str, Any]:
    """How far a finished run is from exact: every expected key in data/ exactly once
    (per version), every part readable, rejects exactly the bad lines, nothing open in
    failures/. All counts 0 = exact."""
    expected, bad = set(keys), collections.Counter(bad_lines)
    seen: collections.Counter = collections.Counter()
    rejected: collections.Counter = collections.Counter()
    failed, unreadable = set(), []
    for kind in ("data", "rejects", "failures"):
        for path in store.part_paths(kind):
            try:
                part = store.read_part(path)
            except Exception as exc:  # noqa: BLE001 - counted and named below
                unreadable.append(f"{path}: {exc}")
                continue
            if kind == "data":
                seen.update(zip(part.column("key").to_pylist(),
                                part.column("version").to_pylist()))
            elif kind == "rejects":
                rejected.update(part.column("raw").to_pylist())
            else:
                failed.update(part.column("key").to_pylist())
    done = {k for k, _ in seen}
    good_rejected = sum(n for raw, n in rejected.items() if raw not in bad)
    return {
        "lost": sorted(expected - done), "unexpected": sorted(done - expected),
        "duplicated": sorted(f"{k}#{v}" for (k, v), n in seen.items() if n > 1),
        "good_rejected": good_rejected,
        "bad_not_rejected": sum((bad - rejected).values()),
        "rejects_repeated": sum((rejected - bad).values()) - good_rejected,
        "open_failures": sorted(failed - done), "unreadable": unreadable,
    }


def exact(report: dict[str, Any]) -> bool:
    return not any(report[k] for k in report)


# --- standalone: own moto S3 server and local Ray cluster ---------------------------------

def _prompts(path: Path, n: int) -> tuple[list[str], list[str]]:
    """n valid prompts (every 5th without id) + bad lines; returns (keys, bad lines)."""
    from jobs.pipeline.validate import parse_row
    lines = []
    for i in range(n):
        row: dict[str, Any] = {"messages": [{"role": "user", "content": f"Chaos prompt {i}: "
                                             f"step {i % 7} of problem {i * 7919 % 1000}."}]}
        if i % 5:
            row["id"] = f"c{i:05d}"
        lines.append(json.dumps(row))
    bad = ['{"id": "broken", "messages": [', '{"id": "empty", "messages": []}',
           json.dumps({"id": "c00003", "messages": [{"role": "user", "content": "dup"}]})]
    mixed = lines[: n // 2] + bad[:2] + lines[n // 2:] + bad[2:]
    path.write_text("".join(x + "\n" for x in mixed))
    return [parse_row(x)["key"] for x in lines], bad


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=300)
    parser.add_argument("--kills", type=int, default=6, help="kill -9 per trial")
    parser.add_argument("--seed", type=int, default=0, help="first trial's seed")
    parser.add_argument("--time-scale", type=float, default=0.01,
                        help="simulator time scale (larger = slower engines, longer runs)")
    parser.add_argument("--stages", default=",".join(DATA_PLANE),
                        help="comma-separated stages whose workers may be killed "
                        f"(default: all of {','.join(DATA_PLANE)})")
    parser.add_argument("--interval", type=float, nargs=2, default=(1.0, 3.0),
                        metavar=("MIN_S", "MAX_S"), help="seconds between kills")
    parser.add_argument("--work-dir", default="/tmp/raygen-chaos")
    args = parser.parse_args(argv)

    import ray
    import yaml

    from cluster.local_stack import create_bucket, set_local_aws_env, start_s3
    from jobs.config import StorageConfig
    from jobs.io.run_store import RunStore
    from serve_apps.engine_process import free_port
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    set_local_aws_env()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    port = free_port()
    s3 = start_s3(port, log_dir=work)
    create_bucket("raygen-chaos", port)
    endpoint = f"http://127.0.0.1:{port}"
    os.environ["DASHBOARD_METRIC_PORT"] = str(free_port())
    os.environ["AUTOSCALER_METRIC_PORT"] = str(free_port())
    ctx = ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    os.environ["RAY_ADDRESS"] = ctx.address_info["gcs_address"]
    totals = collections.Counter()
    try:
        prompts = work / "prompts.jsonl"
        keys, bad = _prompts(prompts, args.prompts)
        for trial in range(args.trials):
            seed = args.seed + trial
            tree = chaos_config(str(prompts), "s3://raygen-chaos/runs", f"chaos-{os.getpid()}-{seed}",
                                endpoint, args.time_scale)
            cfg = work / f"chaos-{seed}.yaml"
            cfg.write_text(yaml.safe_dump(tree))
            result = chaos_trial(cfg, os.getpid(), seed, args.kills, log_dir=work,
                                 stages=tuple(args.stages.split(",")),
                                 interval_s=tuple(args.interval))
            store = RunStore.for_run(tree["job"]["output"], tree["job"]["run_name"],
                                     StorageConfig(**tree["storage"]))
            report = exactness(store, keys, bad)
            totals.update(trials=1, kills=len(result["kills"]), lost=len(report["lost"]),
                          duplicated=len(report["duplicated"]),
                          good_rejected=report["good_rejected"],
                          inexact=0 if exact(report) else 1)
            print(f"trial seed={seed}: {len(result['kills'])} kills "
                  f"({', '.join(sorted(set(result['kills'])))}), attempts {result['attempts']} "
                  f"(exit codes {result['exit_codes']}), lost {len(report['lost'])}, "
                  f"duplicated {len(report['duplicated'])}, good rows rejected "
                  f"{report['good_rejected']}, exact={exact(report)}", flush=True)
    finally:
        from ray import serve
        serve.shutdown()
        ray.shutdown()
        if s3 is not None:
            s3.terminate()
    print(f"{totals['trials']} trials, {totals['kills']} kills, {totals['lost']} lost, "
          f"{totals['duplicated']} duplicated, {totals['good_rejected']} good rows rejected, "
          f"{totals['inexact']} inexact runs ({args.prompts} prompts + {len(bad)} bad lines each)")
    return 0 if totals["inexact"] == 0 else 1


def chaos_config(rows_file: str, output: str, run_name: str, endpoint: str,
                 time_scale: float, app_name: str = "raygen-chaos") -> dict[str, Any]:
    """A small run on simulator engines, slow enough that kills land mid-run."""
    return {
        "engine": {"kind": "simulator", "model_path": "sim-test", "context_length": 16384,
                   "max_running_requests": 32, "start_timeout_s": 60, "request_timeout_s": 120,
                   "speculative": {"algorithm": "NEXTN"},
                   "simulator": {"time_scale": time_scale, "accept_length": 3.0}},
        "serve": {"app_name": app_name, "max_ongoing_requests": 128,
                  "num_cpus_per_replica": 0.1, "health_check_period_s": 1,
                  "health_check_timeout_s": 5,
                  "autoscaling": {"min_replicas": 2, "max_replicas": 2,
                                  "target_ongoing_requests": 32}},
        "job": {"input": rows_file, "output": output, "run_name": run_name,
                "max_new_tokens": 4096, "batch_size": 8, "rows_per_file": 16,
                "inflight_rows_per_actor": 64, "max_actors": 2, "progress_interval_s": 1,
                "metrics_linger_s": 0,
                "retries": {"max_attempts": 8, "backoff_initial_s": 0.2, "backoff_max_s": 2}},
        "storage": {"endpoint_url": endpoint},
    }


if __name__ == "__main__":
    sys.exit(main())
