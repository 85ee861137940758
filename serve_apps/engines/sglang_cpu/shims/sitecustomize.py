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


# --- strict thinking (--enable-strict-thinking, the per-request thinking budget) ---------
# SGLang 0.5.23 applies the strict-thinking token mask through
# XGrammarGrammarBackend.apply_vocab_mask, which has no CPU branch ("Unsupported device:
# cpu"); its sibling XGrammarGrammar.apply_vocab_mask has one: xgrammar's own CPU kernel.
# The backend's gets that same branch when the module loads; nothing else changes.

_XGRAMMAR_BACKEND = "sglang.srt.constrained.xgrammar_backend"


def _cpu_vocab_mask(original):
    def apply_vocab_mask(logits, vocab_mask):
        if logits.device.type == "cpu":
            from xgrammar import apply_token_bitmask_inplace
            apply_token_bitmask_inplace(logits, vocab_mask, backend="cpu")
            return
        original(logits, vocab_mask)
    return staticmethod(apply_vocab_mask)


class _PatchXGrammarBackend(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != _XGRAMMAR_BACKEND:
            return None
        sys.meta_path.remove(self)  # find the real module once, then wrap its loading
        try:
            import importlib.util
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            backend = module.XGrammarGrammarBackend
            backend.apply_vocab_mask = _cpu_vocab_mask(backend.apply_vocab_mask)
        spec.loader.exec_module = exec_and_patch
        return spec


sys.meta_path.insert(0, _PatchXGrammarBackend())
