"""PyPI's torchvision is a CUDA build whose ``_C`` cannot load beside the CPU torch, and
its ``_meta_registrations`` registers a fake kernel for ``torchvision::nms`` at import,
which fails unless the op exists. transformers imports torchvision on SGLang's path, so
the two op schemas are defined just before torchvision first loads (lazily: a process
that never imports torchvision never imports torch here).

Imported by sitecustomize.py in CPU engine processes; run in-process by
``install_torchvision_hook`` (the model builder, SGLang's parser tests).
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
