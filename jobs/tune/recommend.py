"""From the sweep's points to settings: the best point that does not retract, what it
means for the config, and the table (pure: tests/unit/jobs/tune/).

- A point is clean when its retractions stay within ``RETRACTION_TOLERANCE`` of the rows
  it finished (1%, the issue's bound; 0 when fewer than 100 rows finished): a retracted
  request gives back its KV and is prefilled again, and SGLang's throughput collapses
  under repeated retraction (SGLang #26248).
- A point running as many requests at once as one that retracted, or more, is not clean
  either, whatever its own count: the same pool holds no more rows there, and a short
  point's zero is its sample's luck (a loaded fresh-clone run saw 3 retractions at 16 and
  0 at 32 on a 7-row pool, and the sweep recommended 32).
- Best = the clean point with the most output tok/s; among clean points within
  ``NEAR_BEST`` of it (3%, about a point's noise) the one running the fewest requests:
  the same throughput with room in the pool for the longer outputs a run gathers late.
- The cap it means: the requests that point ran at once (its concurrency, or the cap
  when the concurrency queued above it). Rows in flight per engine: that cap plus a
  queue of a quarter of it, so a finished request is replaced at once (the engine admits
  from its queue only what its pool holds). As config overrides: job.inflight_rows_per_actor
  = rows in flight x replicas / generate actors, serve.max_ongoing_requests twice the
  rows per replica (what the config check asks).
- When the engine ran fewer at once than asked while requests queued, its admission by
  free KV tokens (SGLang's scheduler) bound the point, not the cap: said in a note.
- Figures per GPU: the engine's tok/s over the GPUs a replica holds (one for a cuda
  engine; a replica without a GPU counts as one engine, jobs/analysis/gpu_hours.py), and
  GPU-hours per 1B output tokens = 1e9 / (tok/s per GPU x 3600).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from jobs.analysis.gpu_hours import engine_weight, unit
from jobs.tune.measure import Point

RETRACTION_TOLERANCE = 0.01
NEAR_BEST = 0.97
QUEUE_SHARE = 0.25


def clean(p: Point) -> bool:
    return p.output_tok_s > 0 and p.retractions <= RETRACTION_TOLERANCE * p.rows


def safe(p: Point, points: Sequence[Point]) -> bool:
    """Clean, and running fewer requests at once than any point that retracted."""
    retracted = [running_of(q) for q in points if q.output_tok_s > 0 and not clean(q)]
    return clean(p) and all(running_of(p) < r for r in retracted)


def running_of(p: Point) -> int:
    """Requests the point ran at once: its concurrency, at most its cap."""
    return min(p.concurrency, p.cap)


def admitted_below(p: Point) -> bool:
    """The engine held the point below what it was asked to run, requests queued: its
    admission by free KV tokens bound it, not the cap."""
    return p.queued >= 1 and p.running < 0.9 * running_of(p)


def per_gpu(p: Point, gpus_per_engine: Optional[float]) -> float:
    return p.output_tok_s / engine_weight(gpus_per_engine)


def gpu_hours_per_1b(tok_s_per_gpu: float) -> Optional[float]:
    return 1e9 / (tok_s_per_gpu * 3600) if tok_s_per_gpu > 0 else None


@dataclass
class Recommendation:
    point: Optional[Point]
    cap: Optional[int] = None
    rows_in_flight: Optional[int] = None        # per engine
    overrides: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def recommend(points: Sequence[Point], replicas: int, actors: int,
              gpus_per_engine: Optional[float] = None) -> Recommendation:
    measured = [p for p in points if p.output_tok_s > 0]
    good = [p for p in measured if safe(p, measured)]
    if not good:
        low = min((running_of(p) for p in points), default=None)
        note = (f"every point retracted (or generated nothing): even {low} requests at once "
                f"outgrow the engine's KV pool at this budget. Lower the cap below {low} "
                f"(--concurrency with smaller values to find where it stops) or give the "
                f"engine a larger pool (engine.mem_fraction_static, engine.max_total_tokens)"
                if low is not None else "no point was measured")
        return Recommendation(None, notes=[note])
    top = max(p.output_tok_s for p in good)
    best = min((p for p in good if p.output_tok_s >= NEAR_BEST * top),
               key=lambda p: (running_of(p), -p.output_tok_s))
    cap = running_of(best)
    rows = cap + max(1, math.ceil(QUEUE_SHARE * cap))
    per_actor = math.ceil(rows * replicas / actors)
    share = math.ceil(per_actor * actors / replicas)
    rec = Recommendation(best, cap, rows, [
        f"engine.max_running_requests={cap}",
        f"job.inflight_rows_per_actor={per_actor}",
        f"serve.max_ongoing_requests={max(2 * share, cap)}"])
    widest = max(running_of(p) for p in measured)
    if admitted_below(best):
        rec.notes.append(f"the engine ran {best.running:.1f} requests at once there with "
                         f"{best.queued:.1f} queued: its KV pool's admission bound the batch, "
                         f"not the cap (a cap above ~{math.ceil(best.running)} changes little "
                         f"at this budget; a larger pool would)")
    elif running_of(best) == widest and best.output_tok_s >= NEAR_BEST * max(
            p.output_tok_s for p in measured):
        rec.notes.append(f"throughput was still rising at the most requests swept ({widest}): "
                         f"a larger cap may do more (--caps {widest},{2 * widest}; each cap "
                         f"is an engine start)")
    retracting = sorted({running_of(p) for p in measured if not clean(p)})
    if retracting:
        rec.notes.append(f"retracted at {', '.join(map(str, retracting))} requests at once: "
                         f"the KV pool cannot hold them at this budget")
        above = [r for r in retracting if r > cap]
        if above and above[0] > cap * (1 + QUEUE_SHARE):
            rec.notes.append(f"the best cap lies between {cap} (clean) and {above[0]} "
                             f"(retracted): narrow it with --concurrency "
                             f"{','.join(map(str, _between(cap, above[0])))}")
    if best.token_usage_max >= 0.95:
        rec.notes.append(f"the chosen point filled the KV pool to {best.token_usage_max:.0%}: "
                         f"outputs longer than the sweep's (a run's long tail) may retract; "
                         f"a cap a little lower is safer")
    return rec


def _between(low: int, high: int, steps: int = 4) -> list[int]:
    return sorted({round(low + (high - low) * k / steps) for k in range(steps + 1)})


HEADERS = ["cap", "concurrency", "running", "queued", "out tok/s/{g}", "{u}/1B tok",
           "token usage (max)", "retracted", "rows", "accept len"]


def table(points: Sequence[Point], gpus_per_engine: Optional[float],
          chosen: Optional[Point] = None) -> list[str]:
    g = "GPU" if unit(gpus_per_engine) == "GPU-h" else "engine"
    heads = [h.format(g=g, u=unit(gpus_per_engine)) for h in HEADERS]
    rows = []
    for p in points:
        tok = per_gpu(p, gpus_per_engine)
        hours = gpu_hours_per_1b(tok)
        rows.append([str(p.cap), str(p.concurrency), f"{p.running:.1f}", f"{p.queued:.1f}",
                     f"{tok:,.0f}", "-" if hours is None else f"{hours:,.1f}",
                     f"{p.token_usage:.2f} ({p.token_usage_max:.2f})", str(p.retractions),
                     str(p.rows), "-" if p.accept_length is None else f"{p.accept_length:.2f}"]
                    + (["<- recommended"] if p is chosen else []))
    widths = [max(len(r[i]) for r in [heads] + rows) for i in range(len(heads))]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) + (
        "  " + r[-1] if len(r) > len(heads) else "") for r in rows]
    return lines


def describe(rec: Recommendation, gpus_per_engine: Optional[float], replicas: int,
             actors: int) -> list[str]:
    if rec.point is None:
        return ["recommended: nothing (see below)"] + [f"  note: {n}" for n in rec.notes]
    tok = per_gpu(rec.point, gpus_per_engine)
    u = unit(gpus_per_engine)
    return [
        f"recommended: engine.max_running_requests {rec.cap}, {rec.rows_in_flight} rows in "
        f"flight per engine ({rec.cap} running + a queue of {rec.rows_in_flight - rec.cap})",
        f"  measured there: {tok:,.0f} output tok/s per {'GPU' if u == 'GPU-h' else 'engine'}, "
        f"{gpu_hours_per_1b(tok):,.1f} {u} per 1B output tokens, {rec.point.retractions} "
        f"retracted, token usage {rec.point.token_usage:.2f} (max "
        f"{rec.point.token_usage_max:.2f})",
        f"  for {replicas} replica(s) and {actors} generate actor(s): "
        + " ".join(f"--set {o}" for o in rec.overrides),
    ] + [f"  note: {n}" for n in rec.notes]


def to_json(points: Sequence[Point], rec: Recommendation,
            gpus_per_engine: Optional[float]) -> dict[str, Any]:
    def one(p: Point) -> dict[str, Any]:
        tok = per_gpu(p, gpus_per_engine)
        return dict(p.to_json(), output_tok_s_per_gpu=round(tok, 1), clean=safe(p, points),
                    gpu_hours_per_1b_output_tokens=(None if gpu_hours_per_1b(tok) is None
                                                    else round(gpu_hours_per_1b(tok), 2)))
    return {"unit": unit(gpus_per_engine), "gpus_per_engine": gpus_per_engine,
            "points": [one(p) for p in points],
            "recommended": None if rec.point is None else {
                "max_running_requests": rec.cap, "rows_in_flight_per_engine": rec.rows_in_flight,
                "overrides": rec.overrides, "point": one(rec.point)},
            "notes": rec.notes}
