from serve_apps.engines.simulator.prefix_cache import PrefixCache


def test_shared_prefix_is_counted_in_blocks():
    c = PrefixCache(capacity_tokens=10_000, block_tokens=16)
    a = list(range(100))
    assert c.match(a) == 0
    c.insert(a)
    assert c.match(a) == 96  # 6 full blocks
    assert c.match(a + [7] * 50) == 96
    assert c.match(a[:40] + [999] * 60) == 32
    assert c.match([5] + a) == 0


def test_never_fully_cached():
    c = PrefixCache(capacity_tokens=10_000, block_tokens=16)
    a = list(range(32))
    c.insert(a)
    assert c.match(a) == 31


def test_lru_eviction():
    c = PrefixCache(capacity_tokens=64, block_tokens=16)  # 4 blocks
    a, b = list(range(64)), list(range(1000, 1064))
    c.insert(a)
    c.insert(b)
    assert c.match(a) == 0 and c.match(b) == 63
