"""Smoke run of the config you will run, on one GPU: it fails when the run would.

    cluster/gpu_smoke.sh [--config FILE] [--model DIR] [--draft DIR] [--rows N]
                         [--prompts FILE] [--output DIR]

Runs the engine section of the named config (default: jobs/configs/qwen36-27b-b200.yaml)
on one replica, everything else as the config has it: the model's flags, speculation,
sampling, the budget, and the rows each engine holds in flight in the real run (the
job's rows in flight over its replicas); --model and --draft put local folders in place
of the model and its drafter, nothing else changes. --rows prompts (the demo's mixed set,
or --prompts FILE) stream through it into a local folder (--output; no S3 needed, so it
runs in the image as it is), then the checks of cluster/smoke_checks.py read what came
back: every row finished, accept length above 1 with speculation on, no flagged row, the
engine's effective running cap and KV pool holding the rows in flight at the budget, no
retraction. A config whose engine runs on the CPU (``device: cpu``) needs no GPU: the
tests show the checks failing that way on SGLang's CPU engine.

It attaches to a running Serve app of the config's name with the same engine (that
engine is then what is checked) or deploys one replica, which it deletes on the way out;
a Ray cluster it started is stopped too.

Then, on the GPU its replica freed, the tuning sweep (`raygen tune`, jobs/tune/): the
config's engine at a ladder of concurrencies around its running-request cap, on the
smoke's prompts, printing output tok/s per GPU, GPU-hours per 1B output tokens, token
usage, retractions and the settings it recommends. It only prints: a sweep that fails
or finds nothing clean leaves the smoke's verdict as the checks made it. ``--tune-seconds``
sets each point's length (0: no sweep); an app that was up before the smoke holds the
GPU, so the sweep is skipped then. Exit 0: every check passed; 1: a check failed
(each printed as ``gpu_smoke: FAILED <check>: ...``, with the run's error when it ended
early); 2: this machine cannot run it (a cuda engine and no GPU, no SGLang 0.5.23) or the
arguments or config are wrong (nothing started).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Optional

import yaml

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / ".local" / "gpu-smoke"
DEFAULT_CONFIG = REPO / "jobs" / "configs" / "qwen36-27b-b200.yaml"
SGLANG = "0.5.23"
TUNE_POINT_S = 20.0
SERVER_INFO_KEYS = ("version", "model_path", "device", "context_length", "max_total_num_tokens",
                    "max_running_requests", "speculative_algorithm",
                    "speculative_num_draft_tokens", "attention_backend", "mem_fraction_static")


class Refused(Exception):
    """The smoke run cannot start here; the message says why."""


class Stopped(BaseException):
    """SIGTERM while the smoke session runs (the shell wrapper's timeout)."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="cluster/gpu_smoke.sh", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(DEFAULT_CONFIG),
                   help="the run config whose engine section is checked (default: the B200 one)")
    p.add_argument("--model", help="a local model folder in place of engine.model_path")
    p.add_argument("--draft", help="a local drafter folder in place of "
                   "engine.speculative.draft_model_path")
    p.add_argument("--rows", type=int, default=64, help="prompts sent (default 64)")
    p.add_argument("--prompts", help="a JSONL prompt file (default: the demo's mixed set)")
    p.add_argument("--output", default=str(WORK / "runs"), help="local folder for the rows")
    p.add_argument("--tune-seconds", type=float, default=TUNE_POINT_S, metavar="S",
                   help=f"seconds per point of the tuning sweep after the checks (default "
                        f"{TUNE_POINT_S:g}; 0: no sweep); it prints, it never fails the smoke")
    args = p.parse_args(argv)
    if args.rows < 1:
        p.error("--rows must be positive")
    if args.tune_seconds < 0:
        p.error("--tune-seconds must be 0 or more")
    return args


def gpu_problem() -> Optional[str]:
    """Why this machine cannot run a cuda engine, or None (jobs/tune/plan.py asks the same
    for `raygen tune`)."""
    from jobs.tune.plan import gpu_problem as problem
    found = problem()
    if found and found.startswith("SGLang"):
        found += f" (this script: PYTHON=<that venv's python> {sys.argv[0]})"
    return found


def _folder(path: str, flag: str) -> str:
    folder = Path(path).expanduser().resolve()
    if not (folder / "config.json").is_file():
        raise Refused(f"{flag} {path}: no config.json there (a local HF model folder is "
                      f"needed: no hub access is attempted)")
    return str(folder)


def smoke_tree(config: str, model: Optional[str], draft: Optional[str], prompts: Path,
               output: str, run_name: str) -> dict[str, Any]:
    """The smoke's run config: ``config`` on one replica that holds what one engine holds
    in the real run, the prompts in, a local folder out."""
    from jobs.config import ConfigError, load_config
    from cluster.smoke_checks import rows_in_flight_per_engine
    try:
        planned = load_config(config)
        tree = yaml.safe_load(Path(config).read_text())
    except (ConfigError, OSError) as exc:
        raise Refused(f"--config {config}: {exc}") from None
    engine = tree["engine"]
    if model:
        engine["model_path"] = _folder(model, "--model")
    if draft:
        if not engine.get("speculative"):
            raise Refused(f"--draft: {config} runs no speculative decoding")
        engine["speculative"]["draft_model_path"] = _folder(draft, "--draft")
    serve = tree.setdefault("serve", {})
    scaling = serve.setdefault("autoscaling", {})
    scaling.update(min_replicas=1, max_replicas=1)
    per_engine = rows_in_flight_per_engine(planned)
    tree["job"].update(input=str(prompts), output=output, run_name=run_name, min_actors=1,
                       max_actors=1, inflight_rows_per_actor=per_engine)
    tree["storage"] = {k: v for k, v in (tree.get("storage") or {}).items()
                       if k not in ("endpoint_url",)}  # a local output needs no S3
    return tree


def _metrics_text(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        return resp.read().decode()


def run_phase(tree: dict[str, Any], prompts: int):
    """Deploy or attach (timed), one session in this process, what came back:
    (smoke_checks.Phase, figures, the run's error or None)."""
    from ray import serve

    from cluster.smoke_checks import Phase, accept_length
    from jobs.config import parse_config
    from jobs.io.run_store import RunStore
    from jobs.pipeline.settings import RunMode
    from jobs.runs.run import RunError, run_job
    from serve_apps.app import deploy_or_attach

    cfg = parse_config(tree)
    started = time.monotonic()
    handle = deploy_or_attach(cfg.engine, cfg.serve)
    startup_s = time.monotonic() - started
    info = handle.info.remote().result()
    before = _metrics_text(info["engine_url"])  # an attached engine's counters count on
    error, job_started = None, time.monotonic()
    try:
        run_job(cfg, RunMode.of_flags(), stop_exc=Stopped)
    except RunError as exc:
        error = str(exc).split("\n")[0]
    job_s = time.monotonic() - job_started
    store = RunStore.for_run(cfg.job.output, cfg.job.run_name, cfg.storage)
    data = store.read_kind("data").to_pandas()
    phase = Phase(cfg=cfg, prompts=prompts, data=data,
                  failures=store.read_kind("failures").num_rows,
                  server_info=info["server_info"], metrics_text=_metrics_text(info["engine_url"]),
                  metrics_before=before)
    figures = {
        "engine_startup_s": round(startup_s, 1), "rows": len(data), "job_s": round(job_s, 1),
        "tok_s": round(float(data.completion_tokens.sum()) / job_s, 1) if len(data) else 0.0,
        "finish_reasons": data.finish_reason.value_counts().to_dict() if len(data) else {},
        "accept_length": accept_length(data),
        "server_info": {k: info["server_info"].get(k) for k in SERVER_INFO_KEYS},
    }
    return phase, figures, error


def tune_tree(config: str, smoke: dict[str, Any]) -> dict[str, Any]:
    """The sweep's config: the user's (its replicas and actors are what the recommended
    settings are for) with the smoke's engine section (--model, --draft) and prompts."""
    tree = yaml.safe_load(Path(config).read_text())
    tree["engine"] = smoke["engine"]
    tree["job"]["input"] = smoke["job"]["input"]
    tree["storage"] = smoke["storage"]
    return tree


def tune_step(config: str, smoke: dict[str, Any], point_s: float, ours: bool,
              say=print) -> None:
    """The tuning sweep after the checks (jobs/tune/): printed, never raising."""
    if point_s <= 0:
        return
    if not ours:
        say("gpu_smoke: tune skipped: the engine's app was running before the smoke (its "
            "GPU is in use); run `raygen tune --config FILE` on a free GPU")
        return
    try:
        from jobs.config import parse_config
        from jobs.tune.command import tune
        from jobs.tune.plan import plan
        from jobs.tune.prompts import sample_prompts
        cfg = parse_config(tune_tree(config, smoke))
        sweep = plan(cfg, point_s=point_s)
        result = tune(cfg, sweep, sample_prompts(cfg, sweep.sample),
                      say=lambda line: say(f"gpu_smoke: {line}"))
        for line in result["lines"]:
            say(f"gpu_smoke: {line}" if line else "gpu_smoke:")
    except Exception as exc:  # noqa: BLE001 - the sweep informs; the checks decide
        say(f"gpu_smoke: tune failed (the checks above decide the exit code): "
            f"{type(exc).__name__}: {' '.join(str(exc).split())}")


def leftover_engines() -> list[int]:
    """Engine processes still running (none may be left by a smoke run that started them)."""
    out = subprocess.run(["pgrep", "-f", "sglang.launch_server"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split() if int(p) != os.getpid()]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from jobs.demo_prompts import build
    from cluster.smoke_checks import failed

    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    WORK.mkdir(parents=True, exist_ok=True)
    prompts = WORK / f"prompts-{stamp}.jsonl"
    try:
        if args.prompts:  # its first --rows prompts
            try:
                text = Path(args.prompts).read_text()
            except OSError as exc:
                raise Refused(f"--prompts {args.prompts}: {exc}") from None
            lines = [line for line in text.splitlines() if line.strip()][:args.rows]
        else:
            lines = [json.dumps(r) for r in build(args.rows)]
        tree = smoke_tree(args.config, args.model, args.draft, prompts, args.output,
                          f"smoke-{stamp}")
        device = tree["engine"].get("device", "cuda")
        print(f"gpu_smoke: {args.config}, engine {tree['engine'].get('model_path')} on {device}",
              flush=True)
        problem = gpu_problem() if device == "cuda" else None
        if problem:
            raise Refused(problem)
    except Refused as exc:
        print(f"gpu_smoke: cannot run here: {exc}", file=sys.stderr)
        return 2
    prompts.write_text("".join(line + "\n" for line in lines))
    sent = len(lines)

    import ray
    from ray import serve
    from jobs.config import parse_config
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(log_to_driver=False)
    serve.start(proxy_location="Disabled")
    app = parse_config(tree).serve.app_name
    ours = app not in serve.status().applications  # else: attached, left running
    status = 0
    try:
        phase, figures, error = run_phase(tree, sent)
        print(json.dumps(figures, indent=1, default=str), flush=True)
        lines = failed(phase)
        if error:
            print(f"gpu_smoke: the run ended early: {error}", file=sys.stderr)
        for line in lines:
            print(f"gpu_smoke: FAILED {line}", file=sys.stderr)
        status = 1 if lines else 0
    except Exception as exc:  # noqa: BLE001 - reported, then everything is stopped
        print(f"gpu_smoke: FAILED rows: the smoke run itself failed: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        status = 1
    finally:
        if ours:
            serve.delete(app)
        if started_ray:
            serve.shutdown()
            ray.shutdown()
            left = leftover_engines()
            if left:
                print(f"gpu_smoke: engines still running after the smoke: {left}",
                      file=sys.stderr)
                status = 1
    tune_step(args.config, tree, args.tune_seconds, ours)
    print(f"gpu_smoke: {'ok' if status == 0 else 'failed'}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
