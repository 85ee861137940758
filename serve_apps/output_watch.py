"""A replica that keeps producing broken outputs drains itself, and says which rows.

An engine can break every output while still answering 200 (hybrid models with MTP
drafting and the radix cache have returned empty outputs and token-id loops). The
replica judges each of its successful results with the rows' own integrity flags
(contract/integrity.py); when more than ``engine.drain_flagged_fraction`` of its last
``engine.drain_window_rows`` results are flagged, or its canary disagrees with the
fleet's (serve_apps/canary.py), it is drained: its health check fails (Serve replaces
it: a new engine process) and it refuses further rows as ``engine_dead`` (the job
retries them on the other replicas).

The drain condemns the rows of its window, those still inside its engine, and every
flagged row it returned since its last sound canary (or its start): an engine that breaks
some outputs before the window tips (or a fleet-wide flag rate that hides a slow start)
leaves no flagged row of its own as a key's latest. A canary drain (outputs that look
sound but differ from the fleet's: a drift no flag sees) condemns every row returned since
the last sound canary round began, flagged or not: the drift began after that round's
prompts were answered (rows returned while it waited for its verdict stay). Every
result it returns from then on carries the :class:`Drain` record of its run's condemned
keys (``GenerateResult.drained``), so whichever job actor receives one records it under
the run and those rows are regenerated as new versions (jobs/runs/regenerate.py). The
same record on every later result makes it survive the loss of any one of them; it is
also published in the cluster at once (contract/drain_board.py) for a run none of whose
rows come back through the replica after its drain.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from contract import drain_board
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


@dataclass
class Drain:
    """Why a replica drained, when, and the keys (per run) it condemns."""

    replica: str
    reason: str
    drained_at: float                        # wall clock, seconds
    keys: dict[str, list[str]] = field(default_factory=dict)  # run -> sorted keys

    def record_for(self, run: str) -> dict[str, Any]:
        """What a result of ``run`` carries (jobs/runs/regenerate.py writes it as is)."""
        return {"replica": self.replica, "reason": self.reason,
                "drained_at": self.drained_at, "keys": self.keys.get(run, [])}


class OutputWatch:
    def __init__(self, fraction: Optional[float], window: int, replica: str = "",
                 canary: bool = False):
        self.fraction, self.replica = fraction, replica
        # run -> key -> when observed (the count of results before it), for every result
        # since the last sound canary: kept only with the canary on (it clears them every
        # canary interval; without it they would grow)
        self.since_sound: Optional[dict[str, dict[str, int]]] = \
            collections.defaultdict(dict) if canary else None
        self.observed = 0  # results observed: what a canary round marks at its start
        # (run, key, flags) of the latest successful results
        self.recent: collections.deque[tuple[str, str, tuple[str, ...]]] = \
            collections.deque(maxlen=window)
        self.drain: Optional[Drain] = None
        # run -> key -> when observed, of flagged results since the last sound canary (or
        # the start)
        self.flagged: dict[str, dict[str, int]] = collections.defaultdict(dict)

    @property
    def drained(self) -> Optional[str]:
        """Why, once drained."""
        return self.drain.reason if self.drain else None

    def observe(self, run: str, result: GenerateResult,
                inflight: Iterable[tuple[str, str]] = ()) -> None:
        """A successful result; ``inflight``: (run, key) of the rows still in the engine."""
        if self.drain or result.error_class:
            return
        flags = tuple(result_flags(result))
        self.recent.append((run, result.key, flags))
        seq, self.observed = self.observed, self.observed + 1
        if flags:
            self.flagged[run][result.key] = seq
        if self.since_sound is not None:
            self.since_sound[run][result.key] = seq
        if self.fraction is None or len(self.recent) < self.recent.maxlen:
            return
        bad = [flags for _, _, flags in self.recent if flags]
        if len(bad) / len(self.recent) > self.fraction:
            kinds = collections.Counter(flag for flags in bad for flag in flags)
            named = ", ".join(f"{flag} {n}" for flag, n in kinds.most_common())
            self.drain_now(f"drained: {len(bad)} of its last {len(self.recent)} outputs were "
                           f"flagged ({named}; engine.drain_flagged_fraction "
                           f"{self.fraction:g}); Serve restarts its engine", inflight)

    def sound(self, before: Optional[int] = None) -> None:
        """The canary agreed with the fleet: the engine was sound when the canary's round
        began (``before``: :attr:`observed` then; None: now), so the flagged rows observed
        before it are the prompts' own (regenerated only with --regenerate-flagged). Rows
        observed while the round ran stay: a drift that began after its prompts were
        answered, before its verdict came back, passed it (seen in CI)."""
        if self.drain:
            return
        before = self.observed if before is None else before
        for found in [self.flagged] + ([self.since_sound] if self.since_sound is not None else []):
            for run in list(found):
                kept = {k: seq for k, seq in found[run].items() if seq >= before}
                if kept:
                    found[run] = kept
                else:
                    del found[run]

    def drain_now(self, reason: str, inflight: Iterable[tuple[str, str]] = (),
                  since_sound: bool = False) -> None:
        """Drain (once): condemn the window's rows, those in flight and the flagged rows
        since the last sound canary; ``since_sound`` (a canary drain): every row since it."""
        if self.drain:
            return
        keys: dict[str, set[str]] = collections.defaultdict(set)
        for run, key in [(run, key) for run, key, _ in self.recent] + list(inflight):
            keys[run].add(key)
        also = [self.flagged]
        if since_sound and self.since_sound is not None:
            also.append(self.since_sound)
        for found in also:
            for run, held in found.items():
                keys[run] |= set(held)
        self.drain = Drain(self.replica, reason, time.time(),
                           {run: sorted(k) for run, k in sorted(keys.items())})
        for run in self.drain.keys:  # for a run none of whose rows come back through it
            drain_board.publish(run, self.drain.record_for(run))
        logger.error("replica %s; condemns %d rows", reason,
                     sum(len(k) for k in keys.values()))
