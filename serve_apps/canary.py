"""The canary: a replica whose greedy outputs differ from its fleet's drains.

An engine can go wrong without any output looking broken (a bad weight shard, a
corrupted cache): its rows pass the integrity flags. So each replica sends a few fixed
prompts at temperature 0 (``PROMPTS``, ``engine.canary_max_new_tokens`` each) to its own
engine once it is up and every ``engine.canary_interval_s``, and reports the digest of
the output ids to one board per Serve app and engine config (a detached actor, namespace
``raygen``, as app_claims), which keeps each live replica's latest digest. A replica whose
digest differs from one that more than half of the live replicas report is in the
minority: it drains as one over ``engine.drain_flagged_fraction`` (serve_apps/
output_watch.py). Two replicas that disagree are a tie: nobody can tell which is wrong,
so it is logged and nothing drains (draining the sound one would restart it forever).
A minority replica sends the canary again at once and drains only if it is still in
the minority (``CONFIRM_ROUNDS``): a greedy output that flipped with its batch's
numerics costs one more round, not a restart.
A report expires after ``REPORT_TTL_INTERVALS`` intervals: a replaced replica stops
counting. Rounds in which the engine fails a prompt report nothing.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import time
from typing import Optional

import ray

from contract.protocol import GenerateRequest, GenerateResult

logger = logging.getLogger("ray.serve")
NAMESPACE = "raygen"
ACTOR_NAME = "raygen-canary"
REPORT_TTL_INTERVALS = 3
CONFIRM_ROUNDS = 2  # a replica drains when it is in the minority this many rounds in a row
PROMPTS = (
    "Count from one to ten in words.",
    "What is 17 times 23? Show the steps.",
    "Name the planets of the solar system in order.",
    "Write a Python function that reverses a string.",
)


def requests(max_new_tokens: int) -> list[GenerateRequest]:
    return [GenerateRequest(key=f"canary-{i}", run="canary", category="canary",
                            max_new_tokens=max_new_tokens, sampling={"temperature": 0.0},
                            context_policy="clamp",
                            messages=[{"role": "user", "content": text}])
            for i, text in enumerate(PROMPTS)]


def digest(results: list[GenerateResult]) -> Optional[str]:
    """Of the output ids, in prompt order; None when a prompt failed (no verdict)."""
    if any(r.error_class for r in results):
        return None
    blob = "|".join(",".join(map(str, r.output_token_ids or [])) for r in results)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class CanaryTally:
    """scope (app + engine hash) -> replica -> (digest, expires): the board's logic."""

    def __init__(self) -> None:
        self.reports: dict[str, dict[str, tuple[str, float]]] = {}

    def report(self, scope: str, replica: str, digest_: str, ttl_s: float,
               now: Optional[float] = None) -> Optional[str]:
        """Record this replica's digest; why it diverges (None: it agrees, or a tie)."""
        now = time.monotonic() if now is None else now
        live = self.reports.setdefault(scope, {})
        for gone in [r for r, (_, expires) in live.items() if expires <= now]:
            del live[gone]
        live[replica] = (digest_, now + ttl_s)
        counts = collections.Counter(d for d, _ in live.values())
        top, n = counts.most_common(1)[0]
        if digest_ == top or n * 2 <= len(live):
            if len(counts) > 1:
                logger.warning("canary of %s: no majority among %d replicas (%s)", scope,
                               len(live), dict(counts))
            return None
        return (f"drained: its canary outputs (temperature 0, {len(PROMPTS)} fixed prompts) "
                f"differ from those {n} of the {len(live)} live replicas agree on "
                f"(engine.canary_interval_s); Serve restarts its engine")

    def withdraw(self, scope: str, replica: str) -> None:
        self.reports.get(scope, {}).pop(replica, None)


@ray.remote(num_cpus=0, max_restarts=-1)
class _CanaryBoard(CanaryTally):
    pass


def board():
    """The cluster's canary board (started by the first replica that reports)."""
    return _CanaryBoard.options(name=ACTOR_NAME, namespace=NAMESPACE, lifetime="detached",
                                get_if_exists=True).remote()


class BoardClient:
    """How a replica reports: ``await report(...)`` on the cluster's board (a unit test
    passes an in-process CanaryTally with an async ``report`` instead)."""

    def __init__(self) -> None:
        self.actor = None

    async def report(self, scope: str, replica: str, digest_: str,
                     ttl_s: float) -> Optional[str]:
        if self.actor is None:
            self.actor = board()
        return await self.actor.report.remote(scope, replica, digest_, ttl_s)
