"""The simulator honours sampling_params.sampling_seed: another seed draws another sample of
the same prompt (length and words), the same seed the same one, a continuation under
its seed is exact, and no seed is the unseeded model as before; out-of-range or
non-integer seeds are SGLang's 400s (its typed contract's and SamplingParams.verify's
words; tests/contract/sglang/test_sglang_differential.py compares them)."""

import pytest

from serve_apps.engines.simulator import model as m
from serve_apps.engines.simulator import tokenizer as tk
from serve_apps.engines.simulator.protocol import RequestError, parse_generate

P = m.LengthParams(median_tokens=300.0)
PROMPT = tk.encode("<|im_start|>user\nsum the odd squares<|im_end|>\n<|im_start|>assistant\n")


def test_seeds_draw_distinct_samples_and_a_seed_is_reproducible():
    outs = [m.generate(PROMPT, P, 4096, sampling_seed=s).output_ids for s in range(8)]
    assert len({tuple(o) for o in outs}) == 8
    assert len({len(o) for o in outs}) > 1  # the length is drawn per sample too
    assert m.generate(PROMPT, P, 4096, sampling_seed=3).output_ids == outs[3]
    assert m.generate(PROMPT, P, 4096).output_ids == m.generate(PROMPT, P, 4096).output_ids
    assert m.generate(PROMPT, P, 4096, sampling_seed=2**63 - 1).output_ids not in outs


def test_a_seeded_continuation_goes_on_exactly():
    seed = 9_000_000_000_000_000_000
    single = m.generate(PROMPT, P, 4096, sampling_seed=seed)
    cut = len(single.output_ids) // 2
    first = m.generate(PROMPT, P, cut, sampling_seed=seed)
    assert first.finish_reason["type"] == "length"
    rest = m.generate(PROMPT + first.output_ids, P, 4096 - cut, sampling_seed=seed)
    assert first.output_ids + rest.output_ids == single.output_ids


@pytest.mark.parametrize("seed, message", [
    ("7", 'invalid type: string "7", expected i64'),
    (1.5, "invalid type: floating point `1.5`, expected i64"),  # as SGLang's typed contract
    (2**63, "sampling_seed must be in [-2**63, 2**63 - 1], got 9223372036854775808."),
])
def test_a_bad_seed_is_refused_as_sglang_refuses_it(seed, message):
    with pytest.raises(RequestError) as info:
        parse_generate({"input_ids": [1, 2], "sampling_params": {"sampling_seed": seed}})
    assert str(info.value) == message
    assert parse_generate({"input_ids": [1], "sampling_params": {
        "sampling_seed": -(2**63)}}).sampling_seed == -(2**63)
