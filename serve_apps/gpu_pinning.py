"""A cuda engine's replica checks it sees exactly its one GPU before it starts the engine.

The config already requires serve.num_gpus_per_replica 1 for a cuda engine
(contract.config.gpu_pinning_problem); this catches what the config cannot: a replica
Ray gave no GPU or several (a cluster or deployment edited by hand, a RayService
override), or a CUDA_VISIBLE_DEVICES that does not hide the node's other GPUs. Without
it every engine of a node would load onto GPU 0 (``--base-gpu-id 0``) and die of OOM
one by one, or share it silently.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

from contract.config import GPUS_PER_CUDA_ENGINE


def visible_gpu_problem(ray_gpu_ids: Sequence[object], cuda_visible_devices: Optional[str],
                        expected: int = GPUS_PER_CUDA_ENGINE) -> Optional[str]:
    """One line saying why this replica's GPUs are wrong for its engine (None: right).
    ``ray_gpu_ids``: ray.get_gpu_ids(); ``cuda_visible_devices``: the variable (None: unset)."""
    ray_ids = [str(i) for i in ray_gpu_ids]
    visible = None if cuda_visible_devices is None else [
        d.strip() for d in cuda_visible_devices.split(",") if d.strip()]
    seen = f"ray.get_gpu_ids() {ray_ids}, CUDA_VISIBLE_DEVICES " + (
        "unset" if visible is None else repr(cuda_visible_devices))
    if len(ray_ids) != expected:
        return (f"replica was given {len(ray_ids)} GPUs, its cuda engine needs {expected} "
                f"({seen}); set serve.num_gpus_per_replica: {expected}")
    if visible != ray_ids:
        # Unset or other ids: the engine would see GPUs that are not its own and use GPU 0.
        return (f"CUDA_VISIBLE_DEVICES is not this replica's GPU ({seen}): the engine would "
                f"use another replica's; let Ray set it (no CUDA_VISIBLE_DEVICES in the "
                f"runtime_env, no RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES)")
    return None


def require_own_gpu() -> None:
    """Raise (one line) unless this Ray replica sees exactly its own GPU."""
    import ray
    problem = visible_gpu_problem(ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"))
    if problem:
        raise RuntimeError(problem)
