"""A replica that keeps producing broken outputs drains itself.

An engine can break every output while still answering 200 (hybrid models with MTP
drafting and the radix cache have returned empty outputs and token-id loops). The
replica judges each of its successful results with the rows' own integrity flags
(contract/integrity.py); when more than ``engine.drain_flagged_fraction`` of its last
``engine.drain_window_rows`` results are flagged, it is drained: its health check fails
(Serve replaces it: a new engine process) and it refuses further rows as ``engine_dead``
(the job retries them on the other replicas). The rows it already wrote keep their flags
in data/, so export leaves them out and counts them.
"""

from __future__ import annotations

import collections
import logging
from typing import Optional

from contract.integrity import integrity_flags, repetition_ratio
from contract.protocol import GenerateResult

logger = logging.getLogger("ray.serve")


def result_flags(result: GenerateResult) -> list[str]:
    """The integrity flags of a successful result, as its data/ row will carry them."""
    ids = result.output_token_ids or []
    return integrity_flags({"finish_reason": result.finish_reason,
                            "finished_thinking": result.finished_thinking,
                            "reasoning": result.reasoning, "answer": result.answer,
                            "output_token_ids": ids, "repetition_ratio": repetition_ratio(ids)})


class OutputWatch:
    def __init__(self, fraction: Optional[float], window: int):
        self.fraction = fraction
        self.recent: collections.deque[tuple[str, ...]] = collections.deque(maxlen=window)
        self.drained: Optional[str] = None  # why, once drained

    def observe(self, result: GenerateResult) -> None:
        if self.fraction is None or self.drained or result.error_class:
            return
        self.recent.append(tuple(result_flags(result)))
        if len(self.recent) < self.recent.maxlen:
            return
        bad = [flags for flags in self.recent if flags]
        if len(bad) / len(self.recent) > self.fraction:
            kinds = collections.Counter(flag for flags in bad for flag in flags)
            named = ", ".join(f"{flag} {n}" for flag, n in kinds.most_common())
            self.drained = (f"drained: {len(bad)} of its last {len(self.recent)} outputs were "
                            f"flagged ({named}; engine.drain_flagged_fraction "
                            f"{self.fraction:g}); Serve restarts its engine")
            logger.error("replica %s", self.drained)
