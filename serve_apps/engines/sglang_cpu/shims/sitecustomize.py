"""Loaded at start-up by every Python process of a CPU SGLang engine, and only those.

The launcher (serve_apps/engines/sglang.py) puts this folder first on PYTHONPATH when
``engine.device`` is cpu, so the server, and the scheduler and detokenizer it spawns,
all import it (Python imports ``sitecustomize`` from sys.path at start-up). GPU engines
and every other raygen process never see it; the GPU image does not contain it
(.dockerignore).

What it fixes, each when the module concerned first loads:
- torch.compile compiles a function at its first call instead of at import (below);
- torchvision's op schemas (torchvision_ops.py; also run in-process by the model builder);
- strict thinking's vocabulary mask on CPU (below);
- speculative decoding of a topk-1 draft chain on torch_native attention
  (cpu_speculation.py; the CPU ops it reaches are in sgl_kernel/speculative.py).
"""

import importlib
import importlib.abc
import sys

importlib.import_module("torchvision_ops")  # installs its finder

# --- patches applied when a module of SGLang loads ------------------------------------


class _PatchOnLoad(importlib.abc.MetaPathFinder):
    """Runs ``patches[name](module)`` right after module ``name`` executes (once)."""

    def __init__(self, patches):
        self.patches = dict(patches)

    def find_spec(self, name, path=None, target=None):
        patch = self.patches.pop(name, None)
        if patch is None:
            return None
        import importlib.util
        sys.meta_path.remove(self)  # find the real module, then wrap its loading
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch(module)
        spec.loader.exec_module = exec_and_patch
        return spec


# --- strict thinking (--enable-strict-thinking, the per-request thinking budget) ---------
# SGLang 0.5.23 applies the strict-thinking token mask through
# XGrammarGrammarBackend.apply_vocab_mask, which has no CPU branch ("Unsupported device:
# cpu"); its sibling XGrammarGrammar.apply_vocab_mask has one: xgrammar's own CPU kernel.
# The backend's gets that same branch when the module loads; nothing else changes.


def _cpu_vocab_mask(module):
    backend = module.XGrammarGrammarBackend
    original = backend.apply_vocab_mask

    def apply_vocab_mask(logits, vocab_mask):
        if logits.device.type == "cpu":
            from xgrammar import apply_token_bitmask_inplace
            apply_token_bitmask_inplace(logits, vocab_mask, backend="cpu")
            return
        original(logits, vocab_mask)
    backend.apply_vocab_mask = staticmethod(apply_vocab_mask)


# --- torch.compile at first call, not at import -----------------------------------------
# SGLang decorates dozens of functions with @torch.compile at import time; each decoration
# imports torch's inductor stack (~5 CPU-s in every engine process: a third of a CPU
# engine's start), though the CPU path (torch_native attention, no CUDA graphs) calls
# almost none of them. Here a decorated function is compiled exactly as before, by the
# real torch.compile with the same arguments, at its first call; modules (and anything
# not a plain function) are compiled at once, as before.


def _compile_at_first_call(module):
    import functools
    import types
    real = module.compile

    def compile(model=None, **options):
        if model is None:  # @torch.compile(...) with arguments
            return lambda fn: compile(fn, **options)
        if not isinstance(model, types.FunctionType):
            return real(model, **options)
        compiled = None

        @functools.wraps(model)
        def first_call_compiles(*args, **kwargs):
            nonlocal compiled
            if compiled is None:
                compiled = real(model, **options)
            return compiled(*args, **kwargs)
        return first_call_compiles
    module.compile = compile


# --- speculative decoding (a topk-1 draft chain): cpu_speculation.py -------------------

cpu_speculation = importlib.import_module("cpu_speculation")  # imports no SGLang, no torch

sys.meta_path.insert(0, _PatchOnLoad({
    "torch": _compile_at_first_call,
    "sglang.srt.constrained.xgrammar_backend": _cpu_vocab_mask, **cpu_speculation.PATCHES}))
