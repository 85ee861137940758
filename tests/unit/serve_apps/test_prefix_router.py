"""serve_apps/prefix_router.py's choice, as pure functions: a key's replica order is
stable and moves only a lost replica's keys; the bounded load skips a replica that would
carry more than its share. The router inside real Serve: tests/integration/test_prefix_affinity.py."""

from __future__ import annotations

from collections import Counter

import pytest

from serve_apps.prefix_router import bounded_choice, rendezvous_order

REPLICAS = ["r0", "r1", "r2", "r3"]
KEYS = [f"key-{i}" for i in range(400)]


def test_a_key_always_gets_the_same_order():
    assert all(rendezvous_order(k, REPLICAS) == rendezvous_order(k, list(reversed(REPLICAS)))
               for k in KEYS[:50])


def test_keys_spread_over_the_replicas():
    firsts = Counter(rendezvous_order(k, REPLICAS)[0] for k in KEYS)
    assert set(firsts) == set(REPLICAS) and min(firsts.values()) > 60  # 100 each expected


def test_losing_a_replica_moves_only_its_keys():
    before = {k: rendezvous_order(k, REPLICAS)[0] for k in KEYS}
    after = {k: rendezvous_order(k, REPLICAS[:3])[0] for k in KEYS}
    moved = {k for k in KEYS if before[k] != after[k]}
    assert moved == {k for k in KEYS if before[k] == "r3"}


def test_the_first_replica_within_the_bound_is_chosen():
    order = ["r0", "r1"]
    assert bounded_choice(order, {"r0": 10, "r1": 10}, 1.25) == "r0"
    # r0 at 14 of 20: one more would be 15 > ceil(1.25 * 21 / 2) = 14.
    assert bounded_choice(order, {"r0": 14, "r1": 6}, 1.25) == "r1"
    assert bounded_choice(order, {}, 1.25) == "r0"  # idle fleet: the key's own replica


@pytest.mark.parametrize("factor", [1.0, 1.25, 2.0])
def test_one_hot_key_never_exceeds_the_bound(factor):
    # Every call has the same key (one system prompt for all rows): the loads stay within
    # the factor of the mean instead of piling onto one replica.
    load = dict.fromkeys(REPLICAS, 0)
    order = rendezvous_order("hot", REPLICAS)
    for _ in range(200):
        load[bounded_choice(order, load, factor)] += 1
    assert max(load.values()) <= -(-factor * 200 // len(REPLICAS))
