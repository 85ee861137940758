"""`raygen tune --config FILE` (= python -m jobs.tune): sweep one engine of the config
and recommend its running-request cap and the rows in flight per engine.

Runs the config's engine section (real SGLang or the simulator) on this machine, one
engine at a time, with a sample of the run's own prompts at the run's budget and
sampling; prints a line per point, the table (output tok/s per GPU, GPU-hours per 1B
output tokens, token usage, retractions, accept length) and the settings as --set
overrides. Nothing is written to the run; no Ray, no S3 server (the input may be on S3).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from contract.protocol import GenerateRequest
from jobs.config import ConfigError, load_config
from jobs.tune import recommend as R
from jobs.tune.measure import TuneFailed, measure_cap
from jobs.tune.plan import (DEFAULT_POINT_S, TuneRefused, engine_at, machine_problem,
                            parse_counts, plan)
from serve_apps.engines import default_gpus

DEFAULT_SAMPLE = 256


def add_args(parser: argparse.ArgumentParser) -> None:
    """The options of `python -m jobs.tune` and `raygen tune` (one definition)."""
    parser.add_argument("--config", required=True, metavar="FILE", help="the run's YAML")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key first, e.g. --set job.max_new_tokens=8192")
    parser.add_argument("--concurrency", default=None, metavar="N[,N...]",
                        help="requests in flight per point (default: a quarter, half, 1x "
                             "and 2x the largest cap)")
    parser.add_argument("--caps", default=None, metavar="N[,N...]",
                        help="engine.max_running_requests values (default: the config's; "
                             "each is an engine start)")
    parser.add_argument("--point-seconds", type=float, default=DEFAULT_POINT_S, metavar="S",
                        help=f"wall seconds per point, a third of it settling (default "
                             f"{DEFAULT_POINT_S:g}): the sweep's size with the counts above")
    parser.add_argument("--sample", type=int, default=DEFAULT_SAMPLE, metavar="N",
                        help=f"prompts sampled from job.input (default {DEFAULT_SAMPLE})")
    parser.add_argument("--prompts", default=None, metavar="FILE",
                        help="sample from this JSONL/Parquet file instead of job.input")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="also write the points and the recommendation as JSON")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.tune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Exit 0: the sweep ran (a recommendation or a note why none); 1: it started and
    could not measure; 2: the config or this machine cannot be tuned (nothing started)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    # The engine's own output is relayed to this logger (serve_apps/engine_process.py):
    # kept out of the sweep's lines; a start that fails quotes its last lines anyway.
    logging.getLogger("ray.serve.engine").setLevel(logging.WARNING)
    try:
        cfg = load_config(args.config, args.set)
        sweep = plan(cfg, parse_counts(args.caps, "--caps"),
                     parse_counts(args.concurrency, "--concurrency"), args.point_seconds,
                     args.sample)
        problem = machine_problem(cfg)
        if problem:
            raise TuneRefused(problem)
        # local: pulls in ray (jobs.runs.pilot); raygen's parser imports this module
        # (tests/contract/jobs/test_lazy_imports.py)
        from jobs.tune.prompts import sample_prompts
        prompts = sample_prompts(cfg, sweep.sample, args.prompts)
    except (ConfigError, TuneRefused) as exc:
        print(f"error: cannot tune: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    try:
        result = tune(cfg, sweep, prompts)
    except TuneFailed as exc:
        print(f"error: the sweep failed: {exc}", file=sys.stderr)
        return 1
    print("\n".join(result["lines"]))
    if args.json:
        Path(args.json).write_text(json.dumps(result["json"], indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


def gpus_per_engine(cfg) -> float:
    """GPUs one replica of the config holds (serve.num_gpus_per_replica, else the kind's)."""
    gpus = cfg.serve.num_gpus_per_replica
    return float(default_gpus(cfg.engine) if gpus is None else gpus)


def requests_of(cfg, prompts: list[dict[str, Any]]) -> Callable[[int], Any]:
    """The i-th request of the closed loop: the sample's prompts round and round, at the
    run's budget, sampling (a mix's heaviest setting) and context policy."""
    sampling = cfg.job.main_sampling.to_sglang()

    def make(i: int) -> GenerateRequest:
        row = prompts[i % len(prompts)]
        return GenerateRequest(key=f"tune-{i}", run="tune", category=row.get("category") or "none",
                               max_new_tokens=cfg.job.max_new_tokens, sampling=dict(sampling),
                               context_policy=cfg.job.context_policy,
                               messages=row["messages"], tools=row.get("tools"),
                               request_id=f"tune-{i}")
    return make


def tune(cfg, sweep, prompts: list[dict[str, Any]],
         say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the sweep: {"points", "recommendation", "lines" (the printed report), "json"}."""
    gpus = gpus_per_engine(cfg)
    replicas, actors = cfg.serve.autoscaling.min_replicas, cfg.job.max_actors
    say(f"tune: {cfg.engine.kind} engine {cfg.engine.model_name}, budget "
        f"{cfg.job.max_new_tokens}, {len(prompts)} prompts; {sweep.describe()}")
    points, engines = [], []
    make = requests_of(cfg, prompts)
    for cap in sweep.caps:
        try:
            found, info = measure_cap(engine_at(cfg, cap), cap, sweep.concurrencies,
                                      sweep.point_s, make, say)
        except TuneRefused:
            raise
        except Exception as exc:  # noqa: BLE001 - named, with the cap it happened at
            if isinstance(exc, TuneFailed):
                raise TuneFailed(f"cap {cap}: {exc}") from None
            raise TuneFailed(f"cap {cap}: {type(exc).__name__}: {exc}") from None
        points += found
        engines.append(info)
    rec = R.recommend(points, replicas, actors, gpus)
    pools = ", ".join(f"cap {e['cap']}: runs {e['effective_max_running_requests']}, KV pool "
                      f"{e['max_total_num_tokens']} tokens, started in {e['startup_s']} s"
                      for e in engines)
    lines = [f"engine ({cfg.engine.kind}, {gpus:g} GPU per replica): {pools}", ""]
    lines += R.table(points, gpus, rec.point) + [""]
    lines += R.describe(rec, gpus, replicas, actors)
    if cfg.engine.kind == "simulator":
        scale = cfg.engine.simulator.time_scale
        lines.append(f"  note: a simulated engine at time_scale {scale:g}: its tok/s are "
                     f"{1 / scale:g}x a simulated second's (wall clock), the shape is what "
                     f"carries over")
    out = R.to_json(points, rec, gpus)
    out["engines"] = engines
    return {"points": points, "recommendation": rec, "lines": lines, "json": out}


if __name__ == "__main__":
    sys.exit(main())
