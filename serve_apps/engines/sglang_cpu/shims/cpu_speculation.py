"""Speculative decoding on SGLang 0.5.23's CPU engine, for a topk-1 draft chain.

SGLang's STANDALONE/EAGLE worker needs two things the torch_native attention backend
(the only one a CPU without AMX runs) does not have; sitecustomize.py applies both when
the module they belong to loads, in CPU engine processes only:

1. ``DraftBackendFactory`` (srt/speculative/draft_utils.py) builds the draft model's
   extend backend from a map with no ``torch_native`` entry ("EAGLE is not supported in
   attention backend torch_native"). It gets one: a ``TorchNativeAttnBackend`` on the
   draft runner. The multi-step draft *decode* backend is left alone: with
   ``--speculative-num-steps 1`` SGLang builds none, and a CPU engine with more steps
   still fails with SGLang's own message.
2. ``TorchNativeAttnBackend.forward_extend`` reads ``extend_prefix_lens`` and
   ``extend_seq_lens``, which a TARGET_VERIFY batch does not carry. For a chain of
   ``draft_token_num`` slots they are the verified length and the chain's length, and
   the causal mask is the chain's mask; a topk > 1 tree is refused by name.

The CPU ops the same path calls are in sgl_kernel/speculative.py. Pinned to 0.5.23:
both patches wrap private internals (tests/integration/sglang/ run them on the engine).
"""

from __future__ import annotations

DRAFT_UTILS = "sglang.srt.speculative.draft_utils"
TORCH_NATIVE = "sglang.srt.layers.attention.torch_native_backend"


def add_torch_native_draft_extend(module) -> None:
    factory = module.DraftBackendFactory
    create = factory._create_backend

    def _create_backend(self, backend_name, backend_map, error_template, stamps_children=False):
        # The draft-extend map is the one passed without stamps_children (the decode map
        # stamps its per-step children); only it gets the entry.
        if not stamps_children and "torch_native" not in backend_map:
            def torch_native():
                from sglang.srt.layers.attention.torch_native_backend import (
                    TorchNativeAttnBackend)
                return "torch_native", TorchNativeAttnBackend(self.draft_model_runner)
            backend_map = {**backend_map, "torch_native": torch_native}
        return create(self, backend_name, backend_map, error_template, stamps_children)

    factory._create_backend = _create_backend


def verify_chains_on_torch_native(module) -> None:
    import torch

    backend = module.TorchNativeAttnBackend
    forward_extend = backend.forward_extend

    def chain_forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        spec = forward_batch.spec_info
        if not (forward_batch.forward_mode.is_target_verify() and spec is not None):
            return forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache)
        topk = getattr(spec, "topk", None) or getattr(spec, "tree_topk", None) or 1
        if topk != 1:
            raise NotImplementedError(
                f"speculative topk {topk} on a CPU engine: the torch_native verify path "
                f"takes a draft chain only (--speculative-eagle-topk 1)")
        kept = (forward_batch.seq_lens, forward_batch.extend_prefix_lens,
                forward_batch.extend_seq_lens)
        chain = spec.draft_token_num
        forward_batch.extend_prefix_lens = forward_batch.seq_lens
        forward_batch.extend_seq_lens = torch.full(
            (forward_batch.batch_size,), chain, dtype=torch.int32, device=q.device)
        forward_batch.seq_lens = forward_batch.seq_lens + chain
        try:
            return forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache)
        finally:
            (forward_batch.seq_lens, forward_batch.extend_prefix_lens,
             forward_batch.extend_seq_lens) = kept

    backend.forward_extend = chain_forward_extend


PATCHES = {DRAFT_UTILS: add_torch_native_draft_extend, TORCH_NATIVE: verify_chains_on_torch_native}
