"""bench.logprob_sizes: each setting's part is larger than the one before it, and the
sampled token's float32 logprob does not compress (a real model's have full mantissas)."""

from bench import logprob_sizes


def test_each_setting_costs_more_and_off_costs_only_metadata():
    (_, before, _), (_, off, off_tok), (_, _, top0), (_, _, top5), (_, _, top20) = \
        logprob_sizes.measure(rows=4, max_new=256, vocab=151_936)
    assert 0 <= off - before < 4096  # three null columns: their metadata only
    assert off_tok + 4 <= top0 < top5 < top20
    assert top20 - top0 > 20 * 4  # at least a float32 per alternative
