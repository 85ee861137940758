"""SGLang's real engine on a CPU: what an ``engine.device: cpu`` engine needs besides flags.

SGLang 0.5.23 serves a small dense model on a CPU (``--device cpu``, torch_native
attention, no CUDA graphs, ``SGLANG_USE_CPU_ENGINE=1``) once two gaps are bridged, both
in ``shims/`` (README.md here has the details):

- ``shims/sitecustomize.py``: defines torchvision's two op schemas before torchvision
  loads (PyPI's torchvision is a CUDA build), gives strict thinking its CPU mask, and
  lets speculative decoding of a topk-1 chain run on torch_native attention
  (``shims/cpu_speculation.py``);
- ``shims/sgl_kernel/``: a stand-in for SGLang's CPU kernel package (no wheel exists):
  the ops speculation calls in plain torch; any other op raises, naming it.

They reach the engine process and its children only, through PYTHONPATH
(``engine_env``, which also narrows SGLang's model registry to the models served:
``other_model_archs``); no other raygen process imports them, and the GPU image leaves the
folder out (.dockerignore). ``models.py`` builds the tiny test models offline.
"""

from __future__ import annotations

import importlib.util
import json
import os
import runpy
from pathlib import Path
from typing import Iterable, Mapping, Optional

from contract.outcomes import EngineStartError

SHIMS = Path(__file__).resolve().with_name("shims")
_hooked: list[bool] = []


def install_torchvision_hook() -> None:
    """Run shims/torchvision_ops.py in this process, once: for code that imports
    transformers on CPU outside an engine (the model builder, SGLang's parser tests)."""
    if not _hooked:
        runpy.run_path(str(SHIMS / "torchvision_ops.py"))
        _hooked.append(True)


def _model_type(model_path: Optional[str]) -> Optional[str]:
    try:
        return json.loads((Path(model_path) / "config.json").read_text())["model_type"]
    except (TypeError, OSError, ValueError, KeyError):
        return None


def _sglang_models_dir() -> Optional[Path]:
    spec = importlib.util.find_spec("sglang")  # locates it; imports nothing
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "srt" / "models"


def other_model_archs(model_paths: Iterable[Optional[str]],
                      models_dir: Optional[Path] = None) -> Optional[str]:
    """SGLANG_DISABLED_MODEL_ARCHS for a CPU engine of these local models: every module of
    SGLang's model registry but the ones named by their model_type. SGLang imports all of
    them (~270 model classes) in each engine process at start, ~4 CPU-s of a process on
    this machine, to serve one tiny model. None (load them all, as SGLang does) when a
    model's type has no module of that name, or SGLang or a config cannot be found: the
    env var only ever narrows what is already certain to be unused."""
    models = models_dir or _sglang_models_dir()
    if models is None:
        return None
    names = {p.stem for p in models.glob("*.py")} - {"__init__"}
    kept = {_model_type(path) for path in model_paths}
    if not names or None in kept or not kept <= names:
        return None
    return ",".join(sorted(names - kept))


def engine_env(environ: Mapping[str, str] = os.environ,
               model_paths: Iterable[Optional[str]] = ()) -> dict[str, str]:
    """The variables a CPU engine process gets on top of the replica's environment;
    ``model_paths``: the model and draft model it serves (other_model_archs)."""
    if not (SHIMS / "sitecustomize.py").is_file():
        raise EngineStartError(
            f"engine.device is cpu, but this install has no CPU shims ({SHIMS} is missing; "
            f"the GPU image leaves them out on purpose). Run CPU engines from a source "
            f"checkout (`make setup`), or set engine.device: cuda on a GPU node.")
    path = [str(SHIMS)] + [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    # One OpenMP thread: without AMX SGLang's CPU engine binds no threads, and torch's
    # default pool (one per core) spins on every op; beside the job's other processes on a
    # small machine that made a KV-pool trial's requests 15x slower (5.4 s -> 81 s, the
    # real-engine tier's ledger), while a tiny model gains nothing from a second thread.
    env = {"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": os.pathsep.join(path),
           "OMP_NUM_THREADS": "1"}
    disabled = other_model_archs(model_paths) if model_paths else None
    if disabled:
        env["SGLANG_DISABLED_MODEL_ARCHS"] = disabled
    return env
