"""The ``sgl_kernel`` CPU ops that speculative decoding reaches in SGLang 0.5.23, written
in plain torch for a STANDALONE/EAGLE *chain* (``--speculative-eagle-topk 1``).

SGLang calls these on device cpu where a GPU runs its Triton kernels
(sglang/kernels/ops/speculative/{spec_tree,eagle,cache_locs}.py,
sglang/kernels/ops/kvcache/cache_move.py); the signatures are those call sites'. They
are written for correctness on tiny test batches, not speed: Python loops per request.
A topk > 1 tree is refused by name (the CPU attention shim, ../cpu_speculation.py,
verifies chains only). Pinned to SGLang 0.5.23: another version may call them
differently, and tests/integration/sglang/ would say so.
"""

from __future__ import annotations

import ctypes

import torch


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                 out_cache_loc, pool_len):
    """Request i's token slots [start_i, end_i) get the next end_i - start_i cache
    locations of ``out_cache_loc`` (packed in request order)."""
    taken = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(),
                               end_offset.tolist()):
        count = end - start
        if count > 0:
            req_to_token[row, start:end] = out_cache_loc[taken:taken + count].to(req_to_token.dtype)
            taken += count


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                 out_cache_loc, pool_len):
    """The inverse gather: request i's slots [start_i, end_i) packed into ``out_cache_loc``."""
    taken = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(),
                               end_offset.tolist()):
        count = end - start
        if count > 0:
            out_cache_loc[taken:taken + count] = req_to_token[row, start:end].to(out_cache_loc.dtype)
            taken += count


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens,
                                           out_cache_loc, pool_len, topk, num_cols):
    """Each request's ``topk * num_cols`` slots from its sequence length on, packed."""
    width = topk * num_cols
    for i, (row, length) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out_cache_loc[i * width:(i + 1) * width] = (
            req_to_token[row, length:length + width].to(out_cache_loc.dtype))


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    """The last accepted token of each request (its accept length counts the bonus)."""
    count = accept_lens.numel()
    last = (torch.arange(count, dtype=torch.int64) * accept_stride
            + accept_lens.to(torch.int64) - 1)
    bonus_tokens[:count] = accept_tokens.reshape(-1)[last].to(bonus_tokens.dtype)


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    """The cache locations of the accepted draft slots, packed (-1 marks no slot)."""
    flat = accept_index.reshape(-1)
    accepted = out_cache_loc[flat[flat != -1].to(torch.int64)]
    accept_out_cache_loc[:accepted.numel()] = accepted.to(accept_out_cache_loc.dtype)


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """Row ``src[i]`` to row ``tgt[i]`` in every KV buffer (raw base pointers, row strides
    in bytes); all source rows are read before the first write, as the kernel's tiles do."""
    sources, targets = src_loc.tolist(), tgt_loc.tolist()
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        rows = [ctypes.string_at(base + s * stride, stride) for s in sources]
        for t, row in zip(targets, rows):
            ctypes.memmove(base + t * stride, row, stride)


def _chain_only(topk) -> None:
    if int(topk) != 1:
        raise NotImplementedError(
            f"speculative topk {topk} on a CPU engine: raygen's CPU ops verify a draft "
            f"chain only (--speculative-eagle-topk 1)")


def build_tree_kernel_efficient_cpu(parent_list, selected_index, verified_seq_len, tree_mask,
                                    positions, retrieve_index, retrieve_next_token,
                                    retrieve_next_sibling, topk, depth, draft_token_num,
                                    tree_mask_mode):
    """The verify "tree" of a topk-1 draft: a chain. Slot 0 is the last verified token,
    slot x its x-th draft; each slot sees the prefix and slots 0..x; its position is the
    sequence length + x; each slot's next is x + 1 and no slot has a sibling."""
    _chain_only(topk)
    mode = int(tree_mask_mode)
    if mode not in (0, 1):  # 2 = QLEN_ONLY_BITPACKING, which SGLang's Triton path lacks too
        raise NotImplementedError(f"tree_mask_mode {mode} on a CPU engine")
    width = int(draft_token_num)
    lengths = verified_seq_len.tolist()
    mask = tree_mask.reshape(-1)
    ahead = 0  # the sum of the earlier requests' sequence lengths
    for b, length in enumerate(lengths):
        for x in range(width):
            flat = b * width + x
            positions.reshape(-1)[flat] = length + x
            retrieve_index.reshape(-1)[flat] = flat
            if x + 1 < width:
                retrieve_next_token.reshape(-1)[flat] = x + 1
            if mode == 0:   # FULL_MASK: a row of prefix + width per slot
                row = width * width * b + ahead * width + (length + width) * x + length
            else:           # QLEN_ONLY: a row of width per slot
                row = width * width * b + width * x
            mask[row:row + width] = torch.arange(width) <= x
        ahead += length


def verify_tree_greedy_cpu(predicts, accept_index, accept_token_num, candidates, retrive_index,
                           retrive_next_token, retrive_next_sibling, target_predict):
    """Greedy verification: from slot 0, follow next/sibling links while a draft token
    equals the target's prediction after the last accepted slot. ``predicts`` gets the
    target's token at every accepted slot and the bonus after the last."""
    batch, width = candidates.shape
    steps = accept_index.shape[1]
    target = target_predict.reshape(-1)
    out = predicts.reshape(-1)
    for b in range(batch):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted, slot = 0, 0
        for _ in range(1, steps):
            slot = int(retrive_next_token[b, slot])
            wanted = int(target[last])
            while slot != -1 and int(candidates[b, slot]) != wanted:
                slot = int(retrive_next_sibling[b, slot])
            if slot == -1:
                break
            out[last] = wanted
            accepted += 1
            last = int(retrive_index[b, slot])
            accept_index[b, accepted] = last
        accept_token_num[b] = accepted
        out[last] = target[last]
