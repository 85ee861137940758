import random

import pytest

from serve_apps.engines.simulator import tokenizer as tk


def test_special_ids_and_layout():
    assert len(set(tk.SPECIAL_IDS.values())) == 7
    assert tk.EOS_ID == tk.encode("<|im_end|>")[0] == tk.IM_END_ID
    assert tk.THINK_END_ID == tk.encode("</think>")[0]
    assert tk.encode("A") == [tk.BYTE_BASE + 65]
    assert 450 <= len(tk.WORDS) <= 600 and len(set(tk.WORDS)) == len(tk.WORDS)
    assert tk.VOCAB_SIZE == tk.WORD_BASE + len(tk.WORDS)
    assert tk.ASSISTANT_MARKER == tuple(tk.encode("<|im_start|>assistant\n"))


@pytest.mark.parametrize(
    "text",
    ["", "hello", "<|im_start|>user\nHi é 漢字 😀<|im_end|>\n<|im_start|>assistant\n<think>\n", "<|im_end", "<<think>>", "a\x00b\n\t"],
)
def test_round_trip_exact(text):
    ids = tk.encode(text)
    assert tk.decode(ids, skip_special_tokens=False) == text


def test_random_unicode_round_trip():
    rng = random.Random(0)
    pieces = list(tk.SPECIAL_TOKENS) + ["a", "ß", "€", "𝄞", " ", "\n", "<", "|", ">"]
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        assert tk.decode(tk.encode(text), False) == text


def test_special_strings_are_single_ids():
    ids = tk.encode("x<|im_start|>y")
    assert ids == [tk.BYTE_BASE + ord("x"), tk.IM_START_ID, tk.BYTE_BASE + ord("y")]


def test_skip_special_tokens_keeps_think_and_tool_tags():
    ids = tk.encode("<|im_start|>a<think>b</think><tool_call>c</tool_call><|im_end|><|endoftext|>")
    assert tk.decode(ids) == "a<think>b</think><tool_call>c</tool_call>"
    assert tk.decode(ids, skip_special_tokens=False).startswith("<|im_start|>")


def test_word_ids_decode_with_leading_space_and_unknown_ids_fail():
    assert tk.decode([tk.WORD_BASE, tk.WORD_BASE + 1]) == " " + tk.WORDS[0] + " " + tk.WORDS[1]
    with pytest.raises(ValueError):
        tk.decode([tk.VOCAB_SIZE])
    with pytest.raises(ValueError):
        tk.decode([-1])
