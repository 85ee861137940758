"""The sweep's shape: which caps, which concurrencies, how long each point; and the
configs it refuses, each with one line naming the key or the machine's problem.

A point is one (running-request cap, concurrency) pair. Each cap is one engine start
(on a GPU the model's load: minutes), so the default sweeps the config's cap alone and
puts the concurrency ladder around it: a concurrency below the cap runs that many
requests at once, what a lower cap would run; above it, the rest wait in the engine's
queue. ``--caps`` adds engine starts for caps the config does not have.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from dataclasses import dataclass
from typing import Optional, Sequence

from jobs.config import RunConfig

SGLANG = "0.5.23"
DEFAULT_POINT_S = 30.0
MIN_POINT_S = 2.0
MAX_POINTS = 24


class TuneRefused(Exception):
    """This config cannot be tuned here; the message says why (exit 2, nothing started)."""


@dataclass(frozen=True)
class Sweep:
    caps: tuple[int, ...]
    concurrencies: tuple[int, ...]   # per cap, ascending
    point_s: float
    sample: int                      # prompts in the sample

    @property
    def points(self) -> int:
        return len(self.caps) * len(self.concurrencies)

    def describe(self) -> str:
        return (f"{self.points} points: caps {', '.join(map(str, self.caps))} x concurrency "
                f"{', '.join(map(str, self.concurrencies))}, {self.point_s:g} s each "
                f"(~{self.points * self.point_s / 60:.1f} min + {len(self.caps)} engine "
                f"start{'s' if len(self.caps) > 1 else ''}), {self.sample} prompts")


def default_concurrencies(cap: int) -> tuple[int, ...]:
    """A quarter, half, all and twice the cap: below it what lower caps would run, above
    it a queue inside the engine."""
    return tuple(sorted({max(1, cap // 4), max(1, cap // 2), cap, 2 * cap}))


def parse_counts(text: Optional[str], flag: str) -> Optional[tuple[int, ...]]:
    """'8,16,32' -> (8, 16, 32), sorted and unique; None for None."""
    if text is None:
        return None
    try:
        values = sorted({int(x) for x in text.replace(" ", "").split(",") if x})
    except ValueError:
        raise TuneRefused(f"{flag} expects whole numbers like 8,16,32, got {text!r}") from None
    if not values or values[0] < 1:
        raise TuneRefused(f"{flag} must list positive numbers, got {text!r}")
    return tuple(values)


def plan(cfg: RunConfig, caps: Optional[Sequence[int]] = None,
         concurrencies: Optional[Sequence[int]] = None, point_s: float = DEFAULT_POINT_S,
         sample: int = 256) -> Sweep:
    """The sweep for ``cfg`` (TuneRefused when it cannot be one)."""
    engine = cfg.engine
    if engine.kind == "simulator" and engine.simulator.time_scale == 0:
        raise TuneRefused("engine.simulator.time_scale is 0: the simulator answers at once "
                          "(zero-latency mode), there is no throughput to tune; set a "
                          "time_scale > 0 (e.g. 0.05, the demo's)")
    caps = tuple(sorted(set(caps))) if caps else (engine.max_running_requests,)
    for cap in caps:
        engine_at(cfg, cap)
    ladder = tuple(concurrencies) if concurrencies else default_concurrencies(max(caps))
    if point_s < MIN_POINT_S:
        raise TuneRefused(f"--point-seconds {point_s:g}: a point needs at least "
                          f"{MIN_POINT_S:g} s (a third of it settles, the rest is measured)")
    if sample < 1:
        raise TuneRefused(f"--sample {sample}: at least one prompt")
    sweep = Sweep(caps, ladder, float(point_s), sample)
    if sweep.points > MAX_POINTS:
        raise TuneRefused(f"{sweep.points} points ({len(caps)} caps x {len(ladder)} "
                          f"concurrencies) is more than {MAX_POINTS}: a sweep is meant to take "
                          f"minutes; give fewer --caps or --concurrency values")
    return sweep


def engine_at(cfg: RunConfig, cap: int):
    """The config's engine section with ``cap`` running requests, validated as the config
    would be (TuneRefused naming the key when the engine cannot run it)."""
    from pydantic import ValidationError
    data = dict(cfg.engine.model_dump(), max_running_requests=cap)
    try:
        return type(cfg.engine).model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"engine.{'.'.join(map(str, e['loc'])) or 'max_running_requests'}: "
                             f"{e['msg']}" for e in exc.errors())
        raise TuneRefused(f"cap {cap}: {problems}") from None


def machine_problem(cfg: RunConfig) -> Optional[str]:
    """Why this machine cannot run the config's engine (None: it can)."""
    engine = cfg.engine
    if engine.kind == "simulator":
        return None
    installed = _sglang_version()
    if installed is None:
        return (f"engine.kind sglang needs SGLang {SGLANG} in this Python (not installed): "
                f"run `raygen tune` in the raygen image, or give it a simulator config")
    if engine.device == "cpu":
        return None
    return gpu_problem(installed)


def _sglang_version() -> Optional[str]:
    if importlib.util.find_spec("sglang") is None:
        return None
    try:
        from importlib.metadata import version
        return version("sglang")
    except Exception:  # noqa: BLE001 - importable but without metadata
        return "unknown"


def gpu_problem(installed: Optional[str] = None) -> Optional[str]:
    """Why this machine cannot run a cuda engine, or None (cluster/gpu_smoke.py asks too)."""
    installed = _sglang_version() if installed is None else installed
    if installed != SGLANG:
        return (f"SGLang {SGLANG} is not installed in this Python (found {installed}); run "
                f"in the raygen image or with a venv that has sglang=={SGLANG} and its CUDA "
                f"stack")
    smi = shutil.which("nvidia-smi")
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30) \
        if smi else None
    if listed is None or listed.returncode != 0 or "GPU" not in listed.stdout:
        why = "nvidia-smi not found" if smi is None else \
            (listed.stderr.strip() or listed.stdout.strip() or "it lists no GPU")
        return f"no NVIDIA GPU on this machine ({why}): a cuda engine needs one"
    return None
