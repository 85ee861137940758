"""The speculative settings SGLang 0.5.23 really runs, re-derived from raygen's config.

SGLang rewrites the ``--speculative-*`` flags while it resolves its server args, and
everything it plans from them (the context reserve above all) uses the rewritten
values, so raygen plans from them too. Each rule below cites the SGLang function it
re-derives (sglang/srt/arg_groups/speculative_hook.py unless noted);
tests/contract/sglang/test_sglang_resolution.py resolves every shipped config and a
table of combinations with SGLang's own code and compares.

- NEXTN is an alias of EAGLE (``_resolve_speculative_algorithm_alias``).
- EAGLE, EAGLE3, STANDALONE (``_handle_eagle_family``): with topk 1 the verify width is
  the chain, num_draft_tokens = num_steps + 1, whatever was asked.
- DFLASH (``_handle_dflash``): num_steps and topk become 1; num_draft_tokens is the
  block size, read from the drafter's config (``dflash_config.block_size``, 16 when it
  names none) unless given. raygen sends none of the three for DFLASH, so the engine
  drafts the block its drafter was trained for.
- The reserve (``managers.utils.compute_num_reserved_tokens``): EAGLE-family only
  (``SpeculativeAlgorithm.is_eagle``: EAGLE, EAGLE3), max(topk x steps, draft tokens)
  on the resolved values; STANDALONE and DFLASH keep their drafts out of the output
  slots and reserve nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

ALIASES = {"NEXTN": "EAGLE"}
# SpeculativeAlgorithm.is_eagle() (NEXTN arrives as EAGLE): drafts sit in output slots.
RESERVING = frozenset({"EAGLE", "EAGLE3"})
# Algorithms whose drafter config sets the verify width; raygen leaves the flags out.
FROM_DRAFTER = frozenset({"DFLASH"})
# _handle_dflash: the block size when the drafter's config names none.
DFLASH_DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class ResolvedSpec:
    """What SGLang's scheduler runs; ``num_draft_tokens`` None: the drafter's block size."""

    algorithm: str
    num_steps: int
    eagle_topk: int
    num_draft_tokens: Optional[int]

    @property
    def reserved_tokens(self) -> int:
        """compute_num_reserved_tokens() on these resolved values."""
        if self.algorithm not in RESERVING:
            return 0
        return max(self.eagle_topk * self.num_steps, self.num_draft_tokens or 0)


def resolve(algorithm: str, num_steps: int, eagle_topk: int, num_draft_tokens: int,
            dflash_block_size: Optional[int] = None) -> ResolvedSpec:
    """SGLang's resolution of these configured --speculative-* values
    (``dflash_block_size``: --speculative-dflash-block-size, passed through extra_args)."""
    name = ALIASES.get(algorithm, algorithm)
    if name in FROM_DRAFTER:
        return ResolvedSpec(name, 1, 1, dflash_block_size)
    if eagle_topk == 1:
        num_draft_tokens = num_steps + 1
    return ResolvedSpec(name, num_steps, eagle_topk, num_draft_tokens)
