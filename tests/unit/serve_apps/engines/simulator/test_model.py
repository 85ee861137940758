import math
import random
import statistics
import time
from collections import Counter

import pytest

from serve_apps.engines.simulator import model as m
from serve_apps.engines.simulator import tokenizer as tk
from contract.simulator_settings import SimulatorSettings

P = m.LengthParams()
CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


def chat(text: str) -> list[int]:
    return tk.encode(CHAT.format(text))


def random_prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [chat(" ".join(rng.choice(tk.WORDS) for _ in range(rng.randint(1, 60))) + f" #{i}") for i in range(n)]


def prompt_with_length(lo: int, hi: int, params: m.LengthParams = P) -> list[int]:
    """A chat prompt whose natural output length lies in [lo, hi]."""
    for i in range(100_000):
        p = chat(f"find me {i}")
        if lo <= m.natural_output_length(p, params) <= hi:
            return p
    raise AssertionError("no prompt found")


def test_settings_defaults_are_the_model_defaults():
    s = SimulatorSettings()
    assert (s.length_median_tokens, s.length_sigma, s.length_prompt_coupling, s.accept_length) == (
        P.median_tokens,
        P.sigma,
        P.prompt_coupling,
        P.accept_length,
    )


def test_default_length_calibration_over_20000_prompts():
    lengths = [m.natural_output_length(p, P) for p in random_prompts(20_000)]
    capped = [min(n, 4096) for n in lengths]
    truncated = sum(n >= 4096 for n in lengths) / len(lengths)  # n == cap also ends on "length" (SGLang checks it first)
    assert 2300 <= statistics.mean(capped) <= 2500
    assert 2200 <= statistics.median(capped) <= 2400
    assert 0.16 <= truncated <= 0.20
    # Through generate(): capped output lengths equal the planned ones.
    for p in random_prompts(150, seed=1):
        g = m.generate(p, P, 4096)
        assert len(g.output_ids) == min(m.natural_output_length(p, P), 4096)
        assert g.finish_reason["type"] == ("length" if m.natural_output_length(p, P) >= 4096 else "stop")


def _median_length(params: m.LengthParams, n_tokens: int, count: int = 2000) -> float:
    rng = random.Random(n_tokens)
    # Raw id lists (no template): the whole input is the prompt.
    prompts = ([i] + [rng.randrange(tk.VOCAB_SIZE)] * (n_tokens - 1) for i in range(count))
    return statistics.median(m.natural_output_length(p, params) for p in prompts)


def test_prompt_coupling_makes_longer_prompts_answer_longer():
    coupled = m.LengthParams(prompt_coupling=0.5)
    # 64 vs 1024 tokens: log-length shifts of -1.0 and +1.0 -> median ratio e^2.
    assert _median_length(coupled, 1024) / _median_length(coupled, 64) == pytest.approx(math.exp(2), rel=0.15)
    # The shift is clipped to +-1.5: 16 and 64 prompt tokens both sit at the -1.5 clip with coupling 1.
    strong = m.LengthParams(prompt_coupling=1.0)
    assert _median_length(strong, 16) / _median_length(strong, 64) == pytest.approx(1.0, rel=0.1)
    assert _median_length(strong, 64) == pytest.approx(P.median_tokens * math.exp(-1.5), rel=0.1)
    # Without coupling the prompt length does not matter.
    assert _median_length(P, 1024) / _median_length(P, 64) == pytest.approx(1.0, rel=0.1)


def test_same_prompt_same_output_and_different_prompts_differ():
    p = chat("hello")
    a, b = m.generate(p, P, 300), m.generate(list(p), P, 300)
    assert a.output_ids == b.output_ids and a.text == b.text
    assert m.generate(chat("hello!"), P, 300).output_ids != a.output_ids


def test_exact_continuation_matches_one_long_run():
    p = prompt_with_length(4300, 8000)
    first = m.generate(p, P, 4096)
    assert first.finish_reason == {"type": "length", "length": 4096}
    second = m.generate(p + first.output_ids, P, 4096)
    single = m.generate(p, P, 8192)
    assert first.output_ids + second.output_ids == single.output_ids
    assert second.finish_reason == single.finish_reason == {"type": "stop", "matched": tk.EOS_ID}
    assert first.text + second.text == single.text
    assert first.reasoning_tokens + second.reasoning_tokens == single.reasoning_tokens
    # Any split point works, including inside the "<think>\n" preamble.
    for k in (1, 2, 3, 777):
        tail = m.generate(p + single.output_ids[:k], P, 8192 - k)
        assert single.output_ids[:k] + tail.output_ids == single.output_ids


def test_think_structure_and_reasoning_tokens():
    p = prompt_with_length(100, 3000)
    g = m.generate(p, P, 8192)
    ids = g.output_ids
    assert ids[:2] == list(tk.THINK_PREFIX) and ids[-1] == tk.EOS_ID and ids.count(tk.EOS_ID) == 1
    t = ids.index(tk.THINK_END_ID)
    assert 0.6 * len(ids) - 1 <= t <= 0.9 * len(ids)
    assert ids[t + 1 : t + 3] == [tk.NEWLINE_ID, tk.NEWLINE_ID]
    assert g.reasoning_tokens == t + 1
    assert g.text.startswith("<think>\n") and "</think>\n\n " in g.text and "<|im_end|>" not in g.text
    # A template that already opened <think> gets the same stream minus the preamble.
    g2 = m.generate(p + list(tk.THINK_PREFIX), P, 8192)
    assert g2.output_ids == ids[2:]
    # Truncated before </think>: every output token is reasoning.
    assert m.generate(p, P, 10).reasoning_tokens == 10


def test_stop_string_trims_text_and_no_stop_trim_keeps_it():
    p = prompt_with_length(500, 3000)
    full = m.generate(p, P, 8192)
    stop = full.text.split(" ")[7]
    stop = " " + stop
    cut = full.text.find(stop)
    g = m.generate(p, P, 8192, stop=[stop, "never-there"])
    assert g.finish_reason == {"type": "stop", "matched": stop}
    assert g.text == full.text[:cut]
    assert g.output_ids == full.output_ids[: len(g.output_ids)]
    assert tk.decode(g.output_ids).endswith(stop)
    kept = m.generate(p, P, 8192, stop=stop, no_stop_trim=True)
    assert kept.text == full.text[: cut + len(stop)]
    # </think> is an ordinary token in text, so it works as a stop string too.
    g = m.generate(p, P, 8192, stop=["</think>"])
    assert g.output_ids[-1] == tk.THINK_END_ID and g.text == full.text[: full.text.find("</think>")]


def test_stop_token_ids_and_length_priority():
    p = prompt_with_length(500, 3000)
    full = m.generate(p, P, 8192)
    t = full.output_ids.index(tk.THINK_END_ID)
    g = m.generate(p, P, 8192, stop_token_ids=[tk.THINK_END_ID])
    assert g.finish_reason == {"type": "stop", "matched": tk.THINK_END_ID}
    assert len(g.output_ids) == t + 1 and "</think>" not in g.text
    # A stop token (or the EOS) on the last allowed token is a stop: SGLang checks stop
    # strings, then stop tokens, then length (Req.update_finish_state).
    g = m.generate(p, P, t + 1, stop_token_ids=[tk.THINK_END_ID])
    assert g.finish_reason == {"type": "stop", "matched": tk.THINK_END_ID}
    g = m.generate(p, P, len(full.output_ids))
    assert g.finish_reason == {"type": "stop", "matched": tk.EOS_ID} and g.output_ids == full.output_ids
    g = m.generate(p, P, t)
    assert g.finish_reason == {"type": "length", "length": t}


def test_ignore_eos_and_min_new_tokens():
    p = prompt_with_length(100, 1000)
    n = m.natural_output_length(p, P)
    g = m.generate(p, P, n + 500, ignore_eos=True)
    assert len(g.output_ids) == n + 500 and tk.EOS_ID not in g.output_ids
    assert g.finish_reason == {"type": "length", "length": n + 500}
    g = m.generate(p, P, n + 500, min_new_tokens=n + 100)
    assert len(g.output_ids) == n + 100 and g.output_ids[-1] == tk.EOS_ID
    # Continuing a finished answer stops at once.
    done = m.generate(p, P, 8192).output_ids
    again = m.generate(p + done, P, 100)
    assert again.output_ids == [tk.EOS_ID] and again.finish_reason["type"] == "stop"


def test_zero_budget_and_no_marker():
    g = m.generate(chat("x"), P, 0)
    assert g.output_ids == [] and g.finish_reason == {"type": "length", "length": 0}
    raw = tk.encode("no template at all")
    assert m.core_length(raw) == len(raw)
    assert m.generate(raw, P, 5).output_ids[:2] == list(tk.THINK_PREFIX)


def test_core_length_uses_last_marker():
    p = chat("a") + tk.encode("<think>\n words") + chat("b")
    assert m.core_length(p) == len(p)
    assert m.core_length(p + [5, 6]) == len(p)


def test_spec_fields():
    assert m.spec_fields(10, None) == {}
    assert m.spec_fields(10, 3.0) == {"spec_verify_ct": 4, "spec_accept_length": 2.5, "spec_accept_rate": 0.5,
                                      "spec_num_correct_drafts": 6, "spec_num_proposed_drafts": 12}
    assert m.spec_fields(0, 3.0)["spec_verify_ct"] == 1 and m.spec_fields(0, 3.0)["spec_num_correct_drafts"] == 0
    accepts = [m.make_plan(p, P).accept_length for p in random_prompts(500)]
    assert all(2.5 <= a <= 3.5 for a in accepts) and statistics.pstdev(accepts) > 0.2
    off = m.LengthParams(accept_length=1.0)
    assert m.make_plan(chat("x"), off).accept_length is None
    low = m.LengthParams(accept_length=1.2)
    assert all(a >= 1.0 for a in (m.make_plan(p, low).accept_length for p in random_prompts(200)))


def test_generation_cost_per_token_is_small():
    prompts = random_prompts(60, seed=9)
    start = time.process_time()  # CPU time: robust to other processes sharing the machine
    tokens = sum(len(m.generate(p, P, 8192, ignore_eos=True).output_ids) for p in prompts)
    per_token_us = (time.process_time() - start) / tokens * 1e6
    assert tokens == 60 * 8192
    # ~0.5 us here; 3 us leaves room for a loaded CI machine.
    assert per_token_us < 3.0, per_token_us


def test_word_choice_is_spread_over_the_vocabulary():
    ids = m.generate(chat("spread"), P, 20000, ignore_eos=True).output_ids
    words = Counter(t for t in ids if t >= tk.WORD_BASE)
    counts = [words[w] for w in range(tk.WORD_BASE, tk.VOCAB_SIZE)]
    expected = sum(counts) / len(tk.WORDS)
    assert min(counts) > 0.3 * expected and max(counts) < 2.0 * expected
    # No short cycles: a 50-token window never repeats verbatim.
    windows = {tuple(ids[i : i + 50]) for i in range(0, len(ids) - 50, 25)}
    assert len(windows) == len(range(0, len(ids) - 50, 25))


def test_non_thinking_template_gives_a_plain_answer():
    # Qwen3 with thinking off renders "<think>\n\n</think>\n\n" into the prompt.
    p = chat("plain") + tk.encode("<think>\n\n</think>\n\n")
    g = m.generate(p, P, 8192)
    assert tk.THINK_END_ID not in g.output_ids and tk.THINK_START_ID not in g.output_ids
    assert g.reasoning_tokens == 0 and g.output_ids[-1] == tk.EOS_ID
    assert g.finish_reason == {"type": "stop", "matched": tk.EOS_ID}
    assert "</think>" not in g.text and g.text.strip()
