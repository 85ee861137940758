"""Prefix affinity against Serve's default routing, on SGLang's real engine (CPU).

``python -m bench prefix [--replicas 2] [--sets system,history,thinking]``

One Serve app of ``--replicas`` real SGLang engines (the sampled test model, real radix
cache) deployed with raygen's router (serve_apps/prefix_router.py). Each prompt set goes
through ``run_job`` twice, side by side: ``default`` (no prefix key: the router takes
the less loaded of two random replicas, Serve's default policy) and ``affinity``
(``serve.prefix_affinity.enabled``: rows keyed by their first characters). Every
engine's radix cache is flushed before each pass, so neither inherits the other's.

Prompt sets (shuffled: the input's order gives no locality for free):

- ``system``: ``--systems`` system prompts of ~``--system-tokens`` tokens, each with many
  short distinct questions (a fleet-wide instruction prefix);
- ``history``: ``--conversations`` multi-turn histories of ~``--history-tokens`` tokens,
  each asked ``--followups`` different last questions (branches of one conversation);
- ``thinking``: the first user's shape, thinking-mode single-turn prompts
  (jobs.demo_prompts.build: little shared prefix).

Per pass: rows, cached-token share (sum of the rows' ``cached_tokens`` over their
``prompt_tokens``, as SGLang reports them), prompt tokens prefilled, rows per replica,
wall s (run_job call to last row written), output tok/s over the wall, and the engines'
steady output rate (``generation_tokens_total``, 10% to 90% of rows done).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shlex
import sys
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from bench.engines import EngineWatch
from bench.modes import REPO
from bench.prompts import cached_jsonl, prompt_file
from bench.run import code_version, engine_urls, machine, wait_running

logger = logging.getLogger("bench")
SETS = ("system", "history", "thinking")
ARMS = ("default", "affinity")
WORDS = ("alpha beta gamma delta record table index cache query model token engine batch "
         "prompt answer reason step check value field stream block graph vector matrix "
         "policy review report summary detail context history system user assistant "
         "number result input output source target format parse order filter").split()


@dataclass
class Options:
    replicas: int = 2
    sets: tuple[str, ...] = SETS
    systems: int = 8
    system_tokens: int = 150
    questions: int = 25          # per system prompt
    conversations: int = 16
    history_tokens: int = 600
    followups: int = 8           # per conversation
    thinking_rows: int = 160
    max_new_tokens: int = 128
    max_running: int = 16
    context_length: int = 2048
    max_total_tokens: int = 16384
    prefix_chars: int = 128
    actors: int = 2
    seed: int = 0
    work_dir: str = str(REPO / ".local" / "bench-prefix")
    app_name: str = "raygen-bench-prefix"


def _text(rng: random.Random, tokens: int) -> str:
    """~tokens tokens of the sampled model's byte tokenizer (one per ASCII byte)."""
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < tokens:
        words.append(rng.choice(WORDS))
    return " ".join(words)


def system_rows(opt: Options, rng: random.Random) -> list[dict[str, Any]]:
    systems = [f"System {s}: " + _text(rng, opt.system_tokens) for s in range(opt.systems)]
    return [{"id": f"sys-{s}-{q}", "category": "system",
             "messages": [{"role": "system", "content": systems[s]},
                          {"role": "user", "content": f"Question {q}: " + _text(rng, 20)}]}
            for s in range(opt.systems) for q in range(opt.questions)]


def history_rows(opt: Options, rng: random.Random) -> list[dict[str, Any]]:
    rows = []
    per_turn = max(20, opt.history_tokens // 6)  # three exchanges of two turns
    for c in range(opt.conversations):
        history = []
        for turn in range(3):
            history += [{"role": "user", "content": f"Chat {c} turn {turn}: " + _text(rng, per_turn)},
                        {"role": "assistant", "content": _text(rng, per_turn)}]
        rows += [{"id": f"conv-{c}-{f}", "category": "history",
                  "messages": history + [{"role": "user", "content": f"Follow-up {f}: "
                                          + _text(rng, 20)}]}
                 for f in range(opt.followups)]
    return rows


def prompt_set(opt: Options, name: str, work: Path) -> Path:
    if name == "thinking":
        return prompt_file(work, opt.thinking_rows, opt.seed)
    rng = random.Random(opt.seed)
    rows = system_rows(opt, rng) if name == "system" else history_rows(opt, rng)
    rng.shuffle(rows)
    tag = (f"{opt.systems}x{opt.system_tokens}x{opt.questions}" if name == "system" else
           f"{opt.conversations}x{opt.history_tokens}x{opt.followups}")
    return cached_jsonl(work / f"prefix-{name}-{tag}-s{opt.seed}.jsonl", rows)


def config_tree(opt: Options, prompts: Path, affinity: bool) -> dict[str, Any]:
    from serve_apps.engines.sglang_cpu import models
    inflight = opt.replicas * 2 * opt.max_running  # every engine saturated, a queue behind
    return {
        "engine": {"kind": "sglang", "device": "cpu", "model_path": str(models.ensure("sampled")),
                   "served_model_name": "raygen-tiny-sampled", "chat_template": "builtin",
                   "context_length": opt.context_length, "max_total_tokens": opt.max_total_tokens,
                   "max_running_requests": opt.max_running, "start_timeout_s": 600,
                   "request_timeout_s": 3600},
        "serve": {"app_name": opt.app_name, "num_cpus_per_replica": 0.1,
                  "max_ongoing_requests": max(opt.max_running, inflight),
                  "autoscaling": {"min_replicas": opt.replicas, "max_replicas": opt.replicas,
                                  "target_ongoing_requests": opt.max_running},
                  "prefix_affinity": {"enabled": affinity, "prefix_chars": opt.prefix_chars}},
        "job": {"input": str(prompts), "output": str(Path(opt.work_dir) / "runs"),
                "run_name": "prefix", "max_new_tokens": opt.max_new_tokens,
                "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1},
                "min_actors": opt.actors, "max_actors": opt.actors,
                "inflight_rows_per_actor": inflight // opt.actors, "batch_size": 64,
                "rows_per_file": 256, "progress_interval_s": 5, "metrics_linger_s": 0},
    }


def flush_caches(urls: list[str], timeout_s: float = 60.0) -> None:
    """Empty every engine's radix cache (SGLang refuses while requests run: retried)."""
    deadline = time.time() + timeout_s
    for url in urls:
        while True:
            try:
                with urllib.request.urlopen(urllib.request.Request(url + "/flush_cache",
                                                                   method="POST"), timeout=10):
                    break
            except Exception as exc:  # noqa: BLE001 - 400 while the engine still runs rows
                if time.time() > deadline:
                    raise RuntimeError(f"could not flush {url}'s cache: {exc}") from exc
                time.sleep(0.5)


class _Never(Exception):
    pass


@dataclass
class Pass:
    prompt_set: str
    arm: str
    rows: int
    expected: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    wall_s: float
    steady_tok_s: Optional[float]
    per_replica: list[int]
    status: str

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def run_pass(opt: Options, name: str, arm: str, prompts: Path, urls: list[str]) -> Pass:
    from jobs.config import parse_config
    from jobs.io.run_store import RunStore
    from jobs.pipeline.settings import RunMode
    from jobs.runs.run import run_job

    tree = config_tree(opt, prompts, affinity=arm == "affinity")
    tree["job"]["run_name"] = f"prefix-{name}-{arm}-{uuid.uuid4().hex[:6]}"
    cfg = parse_config(tree)
    expected = sum(1 for _ in open(prompts))
    flush_caches(urls)
    watch = EngineWatch(urls).start()
    started = time.time()
    try:
        summary = run_job(cfg, RunMode(), stop_exc=_Never)
    finally:
        ended = time.time()
        watch.stop()
    store = RunStore.for_run(cfg.job.output, cfg.job.run_name, cfg.storage)
    read = store.read_kind("data", ["created_at", "prompt_tokens", "cached_tokens",
                                    "completion_tokens", "replica"])
    done = np.sort(read.column("created_at").cast("int64").to_numpy() / 1e3)  # ms -> s
    data = read.to_pydict()
    steady = None
    if len(done) >= 10:
        steady = watch.rate(float(done[int(0.1 * len(done))]), float(done[int(0.9 * len(done))]))
    return Pass(name, arm, rows=len(done), expected=expected,
                prompt_tokens=int(sum(data["prompt_tokens"])),
                cached_tokens=int(sum(c or 0 for c in data["cached_tokens"])),
                output_tokens=int(sum(data["completion_tokens"])), wall_s=ended - started,
                steady_tok_s=steady,
                per_replica=sorted(Counter(data["replica"]).values(), reverse=True),
                status=summary.status)


def table(passes: list[Pass]) -> str:
    lines = ["| prompt set | routing | rows | cached share | prompt tokens prefilled | "
             "rows per replica | wall s | output tok/s | steady tok/s (engines) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in passes:
        steady = f"{p.steady_tok_s:,.0f}" if p.steady_tok_s else "n/a"
        lines.append(
            f"| {p.prompt_set} | {p.arm} | {p.rows}/{p.expected} | {100 * p.cached_share:.1f}% "
            f"| {p.prompt_tokens - p.cached_tokens:,} of {p.prompt_tokens:,} | "
            f"{' / '.join(map(str, p.per_replica))} | {p.wall_s:.1f} | "
            f"{p.output_tokens / p.wall_s:,.0f} | {steady} |")
    return "\n".join(lines)


def run_bench(opt: Options, argv: list[str]) -> tuple[str, list[Pass]]:
    import ray
    from ray import serve

    from jobs.config import parse_config
    from serve_apps.app import deploy_or_attach

    work = Path(opt.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    files = {name: prompt_set(opt, name, work) for name in opt.sets}
    cfg = parse_config(config_tree(opt, files[opt.sets[0]], affinity=True))
    own_ray = not ray.is_initialized()
    if own_ray:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    machine_line, version = machine(), code_version()
    passes = []
    try:
        # Deployed once, with raygen's router: a pass without keys gets its random-two
        # choice (Serve's default policy), so both arms run on the same warm engines.
        handle = deploy_or_attach(cfg.engine, cfg.serve)
        wait_running(opt.app_name, timeout_s=600)
        urls = engine_urls(handle, opt.replicas)
        for name in opt.sets:
            for arm in ARMS:
                logger.warning("bench prefix: %s / %s ...", name, arm)
                passes.append(run_pass(opt, name, arm, files[name], urls))
    finally:
        try:
            serve.delete(opt.app_name)
        except Exception as exc:  # noqa: BLE001
            logger.warning("could not delete Serve app %s: %s", opt.app_name, exc)
        if own_ray:
            serve.shutdown()
            ray.shutdown()
    header = [
        f"Command: `python -m bench prefix {' '.join(shlex.quote(a) for a in argv)}`",
        "",
        f"Settings: {opt.replicas} replicas = real SGLang 0.5.23 engines on this CPU (the "
        f"sampled test model, max_running_requests {opt.max_running}, context "
        f"{opt.context_length}, max_total_tokens {opt.max_total_tokens}), max_new_tokens "
        f"{opt.max_new_tokens}, {opt.actors} generate actors, rows_per_call 16; affinity: "
        f"prefix_chars {opt.prefix_chars}, max_load_factor 1.25. Sets: system = "
        f"{opt.systems} system prompts x ~{opt.system_tokens} tokens x {opt.questions} "
        f"questions; history = {opt.conversations} histories x ~{opt.history_tokens} tokens "
        f"x {opt.followups} follow-ups; thinking = {opt.thinking_rows} demo prompts. "
        f"Caches flushed before every pass.",
        "",
        f"Machine: {machine_line}.",
        "",
        f"raygen code: commit {version}.",
        "",
    ]
    return "\n".join(header) + table(passes), passes


def parse_args(argv: list[str]) -> Options:
    p = argparse.ArgumentParser(prog="python -m bench prefix", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Options()
    p.add_argument("--replicas", type=int, default=d.replicas)
    p.add_argument("--sets", default=",".join(SETS), help=f"of {', '.join(SETS)}")
    for name in ("systems", "system_tokens", "questions", "conversations", "history_tokens",
                 "followups", "thinking_rows", "max_new_tokens", "max_running",
                 "context_length", "max_total_tokens", "prefix_chars", "actors", "seed"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name))
    p.add_argument("--work-dir", default=d.work_dir)
    a = vars(p.parse_args(argv))
    sets = tuple(s.strip() for s in a.pop("sets").split(",") if s.strip())
    unknown = set(sets) - set(SETS)
    if unknown:
        p.error(f"unknown sets {sorted(unknown)}; choose from {', '.join(SETS)}")
    return Options(sets=sets, **a)


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    text, passes = run_bench(parse_args(argv), argv)
    print(text)
    return 0 if all(p.status == "succeeded" and p.rows == p.expected for p in passes) else 1


if __name__ == "__main__":
    sys.exit(main())
