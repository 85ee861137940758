"""Serve request router that keeps calls sharing a prompt prefix on one replica.

Serve's default router (power of two choices) spreads calls at random, so rows that share
a long prefix (a system prompt, a multi-turn history) are prefilled once per engine, and
each engine's radix cache holds every shared prefix instead of its share of them.

A job call that wants affinity names its prefix: ``generate_many.remote(requests,
affinity=KEY)`` (jobs/pipeline/row_sender.py groups rows by key; the key is a hash of the
prompt's first characters, jobs/pipeline/affinity.py). This router ranks the replicas by
rendezvous hashing of (KEY, replica id), so a key keeps its replica while the replica set
is unchanged and only the keys of a lost replica move, and takes the first replica whose
ongoing calls stay within ``max_load_factor`` x the fleet's mean (consistent hashing with
bounded loads): a hot prefix never piles onto one engine while another idles. A call
without a key gets two random replicas, the less loaded one, as with Serve's default.

Why not Ray's ``PrefixCacheAffinityRouter`` (ray.serve.llm): it reads ``.messages`` or
``.prompt`` from the call's first argument (raygen's is a list of requests, so it raises),
it divides by the text length (a continuation carries token ids, no text), and it calls
its prefix-tree actor with a blocking ``ray.get`` on every routing decision.

Deployed only with ``serve.prefix_affinity.enabled`` (serve_apps/app.py).
"""

from __future__ import annotations

import hashlib
import math
import random
from typing import List, Optional

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

AFFINITY_KWARG = "affinity"


def rendezvous_order(key: str, replica_ids: list[str]) -> list[str]:
    """Replica ids by descending hash of (key, id): stable per key, and removing one
    replica moves only the keys it held."""
    def score(rid: str) -> bytes:
        return hashlib.blake2b(f"{key}\x00{rid}".encode(), digest_size=8).digest()
    return sorted(replica_ids, key=score, reverse=True)


def bounded_choice(order: list[str], load: dict[str, int], max_load_factor: float) -> str:
    """The first replica in ``order`` that can take one more call without exceeding
    ``max_load_factor`` x the mean load after it (ceil; at least one call each)."""
    bound = math.ceil(max_load_factor * (sum(load.values()) + 1) / len(order))
    for rid in order:
        if load.get(rid, 0) + 1 <= bound:
            return rid
    return min(order, key=lambda rid: load.get(rid, 0))  # unreachable with factor >= 1


class PrefixAffinityRouter(RequestRouter):
    def initialize_state(self, max_load_factor: float = 1.25) -> None:
        self.max_load_factor = max_load_factor

    def _load(self, replica: RunningReplica) -> int:
        # Serve's own count of this router's ongoing calls per replica (updated on every
        # send, completion and probe); unknown = 0, the base class probes it when chosen.
        return self._replica_queue_len_cache.get(replica.replica_id) or 0

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None
                              ) -> List[List[RunningReplica]]:
        if not candidate_replicas:
            return []
        key = pending_request.kwargs.get(AFFINITY_KWARG) if pending_request else None
        if key is None or len(candidate_replicas) == 1:
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        order = rendezvous_order(key, list(by_id))
        chosen = bounded_choice(order, {rid: self._load(r) for rid, r in by_id.items()},
                                self.max_load_factor)
        # The chosen one first; if its queue is full, the least loaded of the rest.
        return [[by_id[chosen]], [by_id[rid] for rid in order if rid != chosen]]
