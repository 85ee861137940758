"""GPU smoke run: raygen's real SGLang path on one NVIDIA GPU, in under 10 minutes.

    cluster/gpu_smoke.sh [--model DIR] [--draft DIR] [--rows N] [--no-spec] [--deadline-s S]

For the day a GPU is lent: on a machine with one NVIDIA GPU and the pinned SGLang
0.5.23 in this interpreter (the raygen image, or a venv: run the script with that
venv's python, PYTHON=...), with no network needed. It starts the local stack (moto S3
+ a Ray head), then runs `python -m jobs.generate` on a small local model (default: the
tiny sampled model raygen builds offline, serve_apps/engines/sglang_cpu/models.py;
any HF model folder on disk with --model), first without speculative decoding, then
with it (STANDALONE, the model itself as its draft unless --draft names another; off
with --no-spec), and prints per phase: the engine's start-up time, tok/s, finish
reasons, accept length (tokens / verify steps, from the engine's own meta_info) and
the engine's /server_info. Every phase is bounded by the deadline; the Serve app and
the local stack are stopped on the way out, and no engine is left running.

On a machine without a GPU it stops before starting anything, saying what is missing
(exit 2); tests/contract/cluster/test_gpu_smoke.py runs it that far on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / ".local" / "gpu-smoke"
APP = "raygen-gpu-smoke"
SGLANG = "0.5.23"
SERVER_INFO_KEYS = ("version", "model_path", "device", "context_length", "max_total_num_tokens",
                    "max_running_requests", "speculative_algorithm", "attention_backend",
                    "cuda_graph_max_bs_decode", "mem_fraction_static")


class Refused(Exception):
    """The machine cannot run the smoke test; the message says why."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="cluster/gpu_smoke.sh", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="local HF model folder (default: build raygen's tiny "
                   "sampled model into .local/models/sampled)")
    p.add_argument("--draft", help="draft model folder for STANDALONE speculation "
                   "(default: --model itself)")
    p.add_argument("--rows", type=int, default=64, help="prompts per phase (default 64)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--no-spec", action="store_true", help="skip the speculative phase")
    p.add_argument("--deadline-s", type=float, default=570.0,
                   help="stop everything after this long (default 570 s; the shell "
                   "wrapper kills at 600)")
    args = p.parse_args(argv)
    if args.rows < 1 or args.max_new_tokens < 1 or args.deadline_s <= 0:
        p.error("--rows, --max-new-tokens and --deadline-s must be positive")
    return args


def gpu_problem() -> Optional[str]:
    """Why this machine cannot run the smoke test, or None."""
    try:
        from importlib.metadata import version
        installed = version("sglang")
    except Exception:  # noqa: BLE001 - not installed at all
        installed = None
    if installed != SGLANG:
        return (f"SGLang {SGLANG} is not installed in {sys.executable} (found {installed}); "
                f"run this script in the raygen image or with PYTHON=<a venv with sglang=="
                f"{SGLANG} and its CUDA stack>")
    smi = shutil.which("nvidia-smi")
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30) \
        if smi else None
    if listed is None or listed.returncode != 0 or "GPU" not in listed.stdout:
        why = "nvidia-smi not found" if smi is None else \
            (listed.stderr.strip() or listed.stdout.strip() or "it lists no GPU")
        return f"no NVIDIA GPU on this machine ({why}): this smoke test needs one"
    return None


def model_dir(path: Optional[str]) -> Path:
    if path:
        folder = Path(path).expanduser().resolve()
        if not (folder / "config.json").is_file():
            raise Refused(f"--model {path}: no config.json there (a local HF model folder "
                          f"is needed: no hub access is attempted)")
        return folder
    from serve_apps.engines.sglang_cpu import models
    return models.ensure("sampled")


def phase_config(model: Path, draft: Optional[Path], rows_file: Path, run_name: str,
                 max_new_tokens: int) -> dict[str, Any]:
    """The run config of one phase: the real engine on GPU 0, one replica."""
    engine: dict[str, Any] = {
        "kind": "sglang", "model_path": str(model), "served_model_name": "gpu-smoke",
        "chat_template": "builtin", "reasoning_parser": "qwen3", "context_length": 4096,
        "max_running_requests": 32, "mem_fraction_static": 0.5, "start_timeout_s": 420,
        "request_timeout_s": 300}
    if draft is not None:
        engine["speculative"] = {"algorithm": "STANDALONE", "num_steps": 3, "eagle_topk": 1,
                                 "num_draft_tokens": 4, "draft_model_path": str(draft)}
    return {
        "engine": engine,
        "serve": {"app_name": APP, "max_ongoing_requests": 128, "num_cpus_per_replica": 1,
                  "autoscaling": {"min_replicas": 1, "max_replicas": 1,
                                  "target_ongoing_requests": 32}},
        "job": {"input": str(rows_file), "output": "s3://raygen-demo/gpu-smoke",
                "run_name": run_name, "max_new_tokens": max_new_tokens,
                "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1},
                "max_actors": 1, "inflight_rows_per_actor": 64, "batch_size": 16,
                "rows_per_file": 64, "progress_interval_s": 5, "metrics_linger_s": 0},
        "storage": {"endpoint_url": os.environ.get("RAYGEN_S3_ENDPOINT",
                                                   "http://127.0.0.1:9330")},
    }


def run_phase(name: str, tree: dict[str, Any], deadline: float) -> dict[str, Any]:
    """Deploy (timed), run the job through its CLI, read the rows back."""
    import ray
    import yaml
    from ray import serve

    from jobs.config import parse_config
    from jobs.io.run_store import RunStore
    from serve_apps.app import deploy_or_attach

    cfg = parse_config(tree)
    config_file = WORK / f"{name}.yaml"
    config_file.write_text(yaml.safe_dump(tree))
    if not ray.is_initialized():
        ray.init(address="auto", log_to_driver=False)
    started = time.monotonic()
    handle = deploy_or_attach(cfg.engine, cfg.serve)
    startup_s = time.monotonic() - started
    info = handle.info.remote().result()
    left = deadline - time.monotonic()
    if left < 30:
        raise TimeoutError(f"{name}: the deadline passed while the engine started")
    job_started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "jobs.generate", "--config", str(config_file)],
                          cwd=REPO, timeout=left, capture_output=True, text=True)
    job_s = time.monotonic() - job_started
    print(done.stdout[-2000:], flush=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: jobs.generate exited {done.returncode}:\n{done.stderr[-3000:]}")
    store = RunStore.for_run(cfg.job.output, cfg.job.run_name, cfg.storage)
    data = store.read_kind("data").to_pandas()
    serve.delete(APP)
    verify = data.spec_verify_ct.fillna(0)
    spec_rows = verify > 0
    return {
        "phase": name, "engine_startup_s": round(startup_s, 1), "rows": len(data),
        "job_s": round(job_s, 1),  # the whole `jobs.generate` process, start-up included
        "tok_s": round(float(data.completion_tokens.sum()) / job_s, 1),
        "finish_reasons": data.finish_reason.value_counts().to_dict(),
        "accept_length": (round(float(data.completion_tokens[spec_rows].sum()
                                      / verify[spec_rows].sum()), 3)
                          if spec_rows.any() else None),
        "server_info": {k: info["server_info"].get(k) for k in SERVER_INFO_KEYS},
    }


def leftover_engines() -> list[int]:
    """Engine processes of this checkout still running (there must be none at the end)."""
    out = subprocess.run(["pgrep", "-f", "sglang.launch_server"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split() if int(p) != os.getpid()]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    deadline = time.monotonic() + args.deadline_s
    try:
        model = model_dir(args.model)
        draft = None if args.no_spec else (Path(args.draft).resolve() if args.draft else model)
        print(f"gpu_smoke: model {model}" + (f", draft {draft}" if draft else ""), flush=True)
        problem = gpu_problem()
        if problem:
            raise Refused(problem)
    except Refused as exc:
        print(f"gpu_smoke: cannot run here: {exc}", file=sys.stderr)
        return 2

    from cluster import local_stack
    from jobs.demo_prompts import build

    WORK.mkdir(parents=True, exist_ok=True)
    rows_file = WORK / "prompts.jsonl"
    rows_file.write_text("".join(json.dumps(r) + "\n" for r in build(args.rows)))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    phases = [("plain", None)] + ([] if draft is None else [("speculative", draft)])
    results, status = [], 0
    subprocess.run([sys.executable, "-m", "cluster.local_stack", "up"], cwd=REPO, check=True,
                   timeout=max(deadline - time.monotonic(), 1))
    try:
        for name, phase_draft in phases:
            tree = phase_config(model, phase_draft, rows_file, f"smoke-{stamp}-{name}",
                                args.max_new_tokens)
            results.append(run_phase(name, tree, deadline))
            print(json.dumps(results[-1], indent=1), flush=True)
    except Exception as exc:  # noqa: BLE001 - reported, then everything is stopped
        print(f"gpu_smoke: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        status = 1
    finally:
        local_stack.stop_all()
        left = leftover_engines()
        if left:
            print(f"gpu_smoke: engines still running after the stack stopped: {left}",
                  file=sys.stderr)
            status = 1
    print(json.dumps({"results": results, "status": "ok" if status == 0 else "failed"}))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
