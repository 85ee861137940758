"""The CPU ops raygen's sgl_kernel stand-in gives SGLang's speculative path (a topk-1 chain).

Each op is checked on a small batch against what SGLang 0.5.23's Triton kernel of the
same name writes (sglang/kernels/ops/speculative/, kernels/ops/kvcache/cache_move.py),
worked by hand here; the engine-level proof (outputs identical to the non-speculative
run, SGLang's own verify counts) is tests/integration/sglang/test_speculative.py.
"""

from __future__ import annotations

import importlib
import sys

import pytest

from serve_apps.engines import sglang_cpu

# torch comes with the SGLang install, which `make test` runs beside the rest of the unit
# tier: these tests wait for it (the marker), and import torch only when they run, never
# at collection (a half-installed torch would fail the whole tier).
pytestmark = pytest.mark.sglang_set


@pytest.fixture(scope="module")
def torch():
    return importlib.import_module("torch")


@pytest.fixture
def ops(monkeypatch, torch):
    monkeypatch.syspath_prepend(str(sglang_cpu.SHIMS))
    try:
        yield importlib.import_module("sgl_kernel")
    finally:
        for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
            sys.modules.pop(name)


def test_the_chain_tree_of_two_requests(ops, torch):
    width = 3  # 2 draft steps + the verified token
    lengths = torch.tensor([5, 2])
    mask = torch.ones(width * width * 2 + int(lengths.sum()) * width, dtype=torch.bool)
    positions = torch.empty(2 * width, dtype=torch.int64)
    index, next_token, sibling = (torch.full((2, width), -1, dtype=torch.int64) for _ in range(3))
    ops.build_tree_kernel_efficient_cpu(None, torch.zeros(2, width - 1, dtype=torch.int64),
                                        lengths, mask, positions, index, next_token, sibling,
                                        1, width - 1, width, 0)
    assert positions.tolist() == [5, 6, 7, 2, 3, 4]
    assert index.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert next_token.tolist() == [[1, 2, -1], [1, 2, -1]]
    assert sibling.tolist() == [[-1] * width] * 2
    # FULL_MASK: each slot's row is prefix + chain; the chain part is causal
    first = mask[:width * (5 + width)].view(width, 5 + width)
    assert first[:, :5].all()
    assert first[:, 5:].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    second = mask[width * (5 + width):].view(width, 2 + width)  # after request 0's rows
    assert second[:, 2:].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]


def test_a_tree_wider_than_a_chain_is_refused_by_name(ops, torch):
    with pytest.raises(NotImplementedError, match="topk 2 .* draft chain only"):
        ops.build_tree_kernel_efficient_cpu(None, None, torch.tensor([3]), None, None, None,
                                            None, None, 2, 1, 3, 0)


def test_greedy_verify_accepts_the_agreeing_prefix_and_writes_the_bonus(ops, torch):
    # request 0: both drafts agree; request 1: the first draft disagrees
    candidates = torch.tensor([[10, 11, 12], [20, 21, 22]])
    index = torch.tensor([[0, 1, 2], [3, 4, 5]])
    next_token = torch.tensor([[1, 2, -1], [1, 2, -1]])
    sibling = torch.full((2, 3), -1)
    target = torch.tensor([11, 12, 13, 99, 22, 23])  # the target's token after each slot
    predicts = torch.full((6,), -1)
    accept_index = torch.full((2, 3), -1)
    accepted = torch.zeros(2, dtype=torch.int64)
    ops.verify_tree_greedy_cpu(predicts, accept_index, accepted, candidates, index, next_token,
                               sibling, target)
    assert accepted.tolist() == [2, 0]
    assert accept_index.tolist() == [[0, 1, 2], [3, -1, -1]]
    assert predicts.tolist() == [11, 12, 13, 99, -1, -1]  # accepted tokens, then the bonus


def test_bonus_tokens_and_accepted_cache_slots(ops, torch):
    tokens = torch.tensor([[11, 12, 13], [99, 0, 0]])
    bonus = torch.zeros(2, dtype=torch.int64)
    ops.fill_bonus_tokens_cpu(tokens, torch.tensor([3, 1]), bonus, 3)
    assert bonus.tolist() == [13, 99]
    out = torch.full((4,), -1)
    ops.fill_accept_out_cache_loc_cpu(torch.tensor([[0, 1, 2], [3, -1, -1]]),
                                      torch.tensor([40, 41, 42, 43, 44, 45]), out)
    assert out.tolist() == [40, 41, 42, 43]


def test_token_pool_slots_are_written_and_read_back(ops, torch):
    table = torch.zeros(3, 8, dtype=torch.int32)
    ops.assign_req_to_token_pool_cpu(torch.tensor([2, 0]), table, torch.tensor([1, 4]),
                                     torch.tensor([3, 5]), torch.tensor([70, 71, 72]), 8)
    assert table[2, 1:3].tolist() == [70, 71] and table[0, 4].item() == 72
    out = torch.zeros(3, dtype=torch.int64)
    ops.assign_extend_cache_locs_cpu(torch.tensor([2, 0]), table, torch.tensor([1, 4]),
                                     torch.tensor([3, 5]), out, 8)
    assert out.tolist() == [70, 71, 72]
    draft = torch.zeros(4, dtype=torch.int64)
    ops.assign_draft_cache_locs_contiguous_cpu(torch.tensor([2, 0]), table, torch.tensor([1, 3]),
                                               draft, 8, 1, 2)
    assert draft.tolist() == [70, 71, 0, 72]


def test_kv_rows_are_copied_in_every_layer_reading_before_writing(ops, torch):
    layers = [torch.arange(12, dtype=torch.float32).view(4, 3) + 100 * i for i in range(2)]
    before = [layer.clone() for layer in layers]
    ptrs = torch.tensor([layer.data_ptr() for layer in layers])
    strides = torch.tensor([layer.stride(0) * layer.element_size() for layer in layers])
    # rows 0 -> 1 and 1 -> 2 in one call: row 2 gets row 1 as it was before
    ops.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([1, 2]), torch.tensor([0, 1]))
    for layer, old in zip(layers, before):
        assert torch.equal(layer[1], old[0]) and torch.equal(layer[2], old[1])
        assert torch.equal(layer[0], old[0]) and torch.equal(layer[3], old[3])
