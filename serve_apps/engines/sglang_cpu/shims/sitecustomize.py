"""Loaded at start-up by every Python process of a CPU SGLang engine, and only those.

The launcher (serve_apps/engines/sglang.py) puts this folder first on PYTHONPATH when
``engine.device`` is cpu, so the server, and the scheduler and detokenizer it spawns,
all import it (Python imports ``sitecustomize`` from sys.path at start-up). GPU engines
and every other raygen process never see it; the GPU image does not contain it
(.dockerignore).

What it fixes: PyPI's torchvision is a CUDA build whose ``_C`` cannot load beside the CPU
torch, and its ``_meta_registrations`` registers a fake kernel for ``torchvision::nms``
at import, which fails unless the op exists. transformers imports torchvision on
SGLang's path, so the two op schemas are defined just before torchvision first loads
(lazily: a process that never imports torchvision never imports torch here).
"""

import importlib.abc
import sys


class _DefineTorchvisionOps(importlib.abc.MetaPathFinder):
    library = None  # the definitions live as long as this Library object

    def find_spec(self, name, path=None, target=None):
        if name == "torchvision" and _DefineTorchvisionOps.library is None:
            import torch
            lib = torch.library.Library("torchvision", "DEF")
            lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            _DefineTorchvisionOps.library = lib
        return None  # the normal finders load torchvision itself


sys.meta_path.insert(0, _DefineTorchvisionOps())
