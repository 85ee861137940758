"""A small radix-cache stand-in for meta_info.cached_tokens and prefill time.

Design decisions:
- Prefixes are remembered at BLOCK_TOKENS granularity as a chain of hashes
  (hash of previous block hash + block ids) in an LRU dict, not as a real
  radix tree: matching is O(prefix length) with C-speed tuple hashing and the
  memory bound is trivial. Python's hash of int tuples is not randomised, so
  results are reproducible across processes.
- Capacity is the KV pool of the simulated engine (context_length *
  max_running_requests tokens); least recently used blocks are evicted.
- Like SGLang, at least one input token is always computed, so a request is
  never reported as fully cached.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

BLOCK_TOKENS = 16


class PrefixCache:
    def __init__(self, capacity_tokens: int, block_tokens: int = BLOCK_TOKENS) -> None:
        self.block = block_tokens
        self.capacity_blocks = max(1, capacity_tokens // block_tokens)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def _chain(self, ids: Sequence[int]):
        h = 0
        b = self.block
        for i in range(0, len(ids) - b + 1, b):
            h = hash((h, *ids[i : i + b]))
            yield h

    def match(self, ids: Sequence[int]) -> int:
        """Cached tokens of ids' prefix (refreshing the matched blocks), at most len(ids) - 1."""
        blocks = 0
        for h in self._chain(ids):
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            blocks += 1
        return max(0, min(blocks * self.block, len(ids) - 1))

    def insert(self, ids: Sequence[int]) -> None:
        for h in self._chain(ids):
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
