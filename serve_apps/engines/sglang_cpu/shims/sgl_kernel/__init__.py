"""Stand-in for ``sgl_kernel`` on a CPU SGLang engine (on its path only: see sitecustomize).

SGLang 0.5.23's CPU path imports ops from ``sgl_kernel`` (its CPU build, compiled from
sgl-kernel/csrc/cpu for AVX-512/AMX; no PyPI wheel has it: sglang-kernel 0.4.10 holds
CUDA ops only). Serving a dense model with torch_native attention calls none of them:
layers take their ``forward_native`` paths. Speculative decoding (a topk-1 draft chain)
calls a few, written in plain torch in ``speculative.py``. Every other name imports,
and calling one raises NotImplementedError naming the op: a path that needs a real
kernel fails loudly at its first call, never silently.
"""

import importlib

__version__ = "0.0.0+raygen-cpu-stand-in"


# The ops SGLang imports by name, written in torch (speculative.py): loaded at the first
# name asked for, so importing the stand-in never imports torch (make test runs the unit
# tier while torch is still being installed).
__all__ = ["assign_draft_cache_locs_contiguous_cpu", "assign_extend_cache_locs_cpu",
           "assign_req_to_token_pool_cpu", "build_tree_kernel_efficient_cpu",
           "copy_all_layer_kv_cache_cpu", "fill_accept_out_cache_loc_cpu",
           "fill_bonus_tokens_cpu", "verify_tree_greedy_cpu"]


class MissingKernel(NotImplementedError):
    pass


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    if name in __all__:
        # not ``from . import``: that asks this __getattr__ for "speculative" first
        return getattr(importlib.import_module(f"{__name__}.speculative"), name)

    def missing(*args, **kwargs):
        raise MissingKernel(
            f"sgl_kernel.{name} was called, but this CPU engine has only raygen's stand-in "
            f"for sgl_kernel (serve_apps/engines/sglang_cpu/shims): this SGLang path needs "
            f"a real kernel and cannot run on device cpu")

    missing.__name__ = missing.__qualname__ = name
    return missing
