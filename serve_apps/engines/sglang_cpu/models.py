"""Tiny Qwen3 models that SGLang's real CPU engine serves in tests and the demo, built
offline (no hub): ``python -m serve_apps.engines.sglang_cpu.models scripted|sampled``.

Both have a real Qwen3 architecture (hidden 64, 2 layers, 4 query and 2 KV heads,
head_dim 16, vocab 1024, bf16) with HF's random layer weights, and a real fast tokenizer
with the simulator's id layout (serve_apps/engines/simulator/tokenizer.py: 7 special
tokens, 256 bytes, then words; ChatML template). Only the embeddings and the LM head are
chosen, so that the next token depends on the last token alone:

- ``scripted`` (exact assertions): random unit-RMS embeddings, and the LM head row of
  each target id is the embedding of its one predecessor, so greedy decoding follows a
  fixed successor map: ``\\n`` or ``<think>`` -> ``a`` ... ``z`` -> ``</think>`` ->
  ``A`` ... ``J`` -> EOS; ``0`` -> ``1`` ... ``9`` -> EOS; word k -> word k+1 (never
  stops). A chat prompt (which ends in ``<think>\\n``) yields exactly
  ``abc...z</think>ABCDEFGHIJ`` and EOS: 38 tokens, 27 of them reasoning.
- ``sampled`` (story-like lengths): the embedding of a token is one-hot in the
  dimension of its *state* (entry, think-1, think-2, ``</think>``, answer), and each
  head row adds logit ALPHA from the states it continues and BETA from the state it
  advances from. At temperature 1 (top_p 1, top_k -1: what the demo config sends) every
  step stays in its phase or moves to the next with probability ~1/(1+e^4), so a
  completion is two thinking phases of random words, ``</think>``, an answer phase and
  EOS: a sum of three geometric lengths (mean ~180, median ~160), ~19% of them longer
  than 256 tokens, most of them cut while thinking. ``raygen_model.json`` in
  the folder holds the chain and the exact length distribution it implies.
- ``draft`` (the speculative pool's STANDALONE draft for ``scripted``): the same map,
  except that it guesses wrong for every token of the thinking (``\\n``, ``<think>``,
  ``a`` ... ``z``: each to a byte the target never emits); from ``</think>`` on it agrees.
  The target verifies every draft token, so its outputs are scripted's; the accept
  length is SGLang's to count: 1 token a step while thinking, more after.

``ensure(kind)`` builds a model once into ``$RAYGEN_MODEL_CACHE/<kind>`` (default
``<repo>/.local/models``) and rebuilds it when this file or the tokenizer layout
changes; concurrent builders (test workers) each write a temp folder and rename it.
transformers and torch come with the SGLang install (`make setup`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from serve_apps.engines.sglang_cpu import install_torchvision_hook
from serve_apps.engines.simulator import tokenizer as tk

KINDS = ("scripted", "sampled", "draft")
REPO = Path(__file__).resolve().parents[3]
MANIFEST = "raygen_model.json"

VOCAB, HIDDEN = 1024, 64
ARCH = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_bias=False,
            max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1e6,
            tie_word_embeddings=False, bos_token_id=0, eos_token_id=tk.EOS_ID,
            pad_token_id=tk.ENDOFTEXT_ID, hidden_act="silu")
CHAT_TEMPLATE = (
    "{%- for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{%- endfor %}"
    "{%- if add_generation_prompt %}{{'<|im_start|>assistant\\n'}}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{'<think>\\n\\n</think>\\n\\n'}}{%- endif %}{%- endif %}")


def byte_id(char: str) -> int:
    return tk.BYTE_BASE + ord(char)


# --- the tokenizer (shared with the oracle tier's fake model) ---------------------------

def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what a ByteLevel BPE vocabulary is keyed by)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
                 + list(range(ord("\xae"), ord("\xff") + 1)))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def write_tokenizer(out: Path) -> None:
    """A fast tokenizer whose ids and text are the simulator tokenizer's, + ChatML."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    alphabet = _byte_alphabet()
    vocab = {s: i for i, s in enumerate(tk.SPECIAL_TOKENS)}
    vocab.update({alphabet[b]: tk.BYTE_BASE + b for b in range(256)})
    vocab.update({"".join(alphabet[x] for x in (" " + w).encode()): tk.WORD_BASE + j
                  for j, w in enumerate(tk.WORDS)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    control = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}  # skipped by skip_special_tokens
    tok.add_tokens([AddedToken(s, special=s in control, normalized=False)
                    for s in tk.SPECIAL_TOKENS])
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                            pad_token="<|endoftext|>",
                            chat_template=CHAT_TEMPLATE).save_pretrained(str(out))


def write_generation_config(out: Path) -> None:
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [tk.EOS_ID, tk.ENDOFTEXT_ID], "bos_token_id": 0,
         "pad_token_id": tk.ENDOFTEXT_ID}))


# --- scripted: a successor map ----------------------------------------------------------

def successor_map() -> dict[int, int]:
    """The scripted model's greedy next token of each mapped id (one predecessor each,
    except EOS: two chains end there)."""
    succ = {tk.WORD_BASE + k: tk.WORD_BASE + (k + 1) % len(tk.WORDS) for k in range(len(tk.WORDS))}
    chain = ([byte_id(c) for c in "abcdefghijklmnopqrstuvwxyz"] + [tk.THINK_END_ID]
             + [byte_id(c) for c in "ABCDEFGHIJ"] + [tk.EOS_ID])
    succ[byte_id("\n")] = succ[tk.THINK_START_ID] = chain[0]
    succ.update(zip(chain, chain[1:]))
    digits = [byte_id(c) for c in "0123456789"] + [tk.EOS_ID]
    succ.update(zip(digits, digits[1:]))
    return succ


def draft_successor_map() -> dict[int, int]:
    """``draft``'s map: scripted's, with a wrong guess for each thinking token (its next
    token a distinct high byte: 0x80 + i, which no scripted chain contains)."""
    succ = successor_map()
    thinking = [byte_id("\n"), tk.THINK_START_ID] + [byte_id(c) for c in "abcdefghijklmnopqrstuvwxyz"]
    succ.update({source: tk.BYTE_BASE + 0x80 + i for i, source in enumerate(thinking)})
    return succ


def _scripted_weights(torch: Any, succ: dict[int, int] | None = None
                      ) -> tuple[Any, Any, dict[str, Any]]:
    succ = successor_map() if succ is None else succ
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(VOCAB, HIDDEN, generator=gen)
    emb = emb / emb.pow(2).mean(-1, keepdim=True).sqrt()  # unit RMS: |e|^2 = HIDDEN
    head = torch.zeros(VOCAB, HIDDEN)
    # logit(target | last) = e_last . e_pred(target) ~ 64 against N(0, 8) for the rest.
    # Unmapped ids are left out: a shared "default" row would sum hundreds of embeddings.
    for source, target in succ.items():
        head[target] += emb[source]
    return emb, head, {"successor_map": {str(k): v for k, v in succ.items()}}


# --- sampled: a Markov chain of phases --------------------------------------------------

# Logits (each exact in bf16 once divided by sqrt(HIDDEN)): stay in a phase (one of
# PHASE_WORDS words), advance to the next phase's words, or to the one token that ends a
# phase's last state (</think>, EOS). Chosen for ~19% of completions over 256 tokens.
ALPHA, BETA, SINGLE = 20.0, 16.0, 19.375
PHASE_WORDS = 32
LAYER_OUTPUT_SCALE = 0.1
ENTRY, THINK_1, THINK_2, THINK_END, ANSWER = range(5)  # states = embedding dimensions
# Where in tk.WORDS each phase's words start: "let consider think ...", "call run build ...",
# "the of and ...".
PHASE_OFFSETS = {THINK_1: 350, THINK_2: 240, ANSWER: 0}


def phase_words() -> dict[int, list[int]]:
    return {state: [tk.WORD_BASE + off + i for i in range(PHASE_WORDS)]
            for state, off in PHASE_OFFSETS.items()}


def state_of() -> dict[int, int]:
    """Each token's state; every id not listed is ENTRY (prompt bytes, specials, EOS)."""
    states = {tid: state for state, ids in phase_words().items() for tid in ids}
    states[tk.THINK_END_ID] = THINK_END
    return states


def chain_probabilities() -> dict[str, float]:
    """The per-step probability of leaving each phase, from the logits as stored."""
    from_phase = 1 / (1 + math.exp(ALPHA - BETA))  # PHASE_WORDS advance targets vs as many stays
    from_last = math.exp(SINGLE) / (PHASE_WORDS * math.exp(ALPHA) + math.exp(SINGLE))
    return {"think_1": from_phase, "think_2": from_last, "answer": from_last}


def length_distribution(max_len: int = 4096) -> list[float]:
    """P(completion has exactly n tokens), n = 0..max_len-1: three geometric phase
    lengths (each >= 1) plus </think> and EOS."""
    import numpy as np
    dist = np.zeros(max_len)
    dist[2] = 1.0  # </think> and EOS
    n = np.arange(max_len)
    for q in chain_probabilities().values():
        geometric = np.where(n >= 1, q * (1 - q) ** np.maximum(n - 1, 0), 0.0)
        dist = np.convolve(dist, geometric)[:max_len]
    return dist.tolist()


def truncated_share(budget: int) -> float:
    """Expected share of completions longer than ``budget`` tokens (finish_reason length)."""
    return 1.0 - sum(length_distribution(budget + 1))


def _sampled_weights(torch: Any) -> tuple[Any, Any, dict[str, Any]]:
    scale = math.sqrt(HIDDEN)  # a one-hot embedding of norm sqrt(HIDDEN) has unit RMS
    emb = torch.zeros(VOCAB, HIDDEN)
    states = state_of()
    for tid in range(VOCAB):
        emb[tid, states.get(tid, ENTRY)] = scale
    head = torch.zeros(VOCAB, HIDDEN)
    words = phase_words()
    flow = [(ENTRY, THINK_1), (THINK_1, THINK_2), (THINK_END, ANSWER)]
    for came_from, state in flow:      # enter the phase from the previous state, then stay
        for tid in words[state]:
            head[tid, state] = ALPHA / scale
            head[tid, came_from] = (ALPHA if came_from in (ENTRY, THINK_END) else BETA) / scale
    head[tk.THINK_END_ID, THINK_2] = SINGLE / scale
    head[tk.EOS_ID, ANSWER] = SINGLE / scale
    dist = length_distribution(1024)
    expected = {"mean_uncapped": sum(n * p for n, p in enumerate(dist)),
                "truncated_share": {str(b): truncated_share(b) for b in (128, 256, 384, 512)}}
    return emb, head, {"alpha": ALPHA, "beta": BETA, "phase_words":
                       {str(k): v for k, v in words.items()},
                       "p_leave_phase": chain_probabilities(), "expected": expected,
                       "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1}}


# --- building and caching ---------------------------------------------------------------

def builder_hash() -> str:
    """Identifies what a build produces: this file and the simulator's id layout."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(Path(tk.__file__).read_bytes())
    return digest.hexdigest()[:16]


def build(kind: str, out: Path) -> Path:
    """Write model ``kind`` into the new folder ``out``."""
    install_torchvision_hook()
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if kind not in KINDS:
        raise ValueError(f"unknown test model {kind!r}; one of {', '.join(KINDS)}")
    out.mkdir(parents=True)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**ARCH))
    if kind == "sampled":
        emb, head, card = _sampled_weights(torch)
    else:
        emb, head, card = _scripted_weights(
            torch, draft_successor_map() if kind == "draft" else successor_map())
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(emb)
        model.lm_head.weight.copy_(head)
        if kind == "sampled":
            # The layers still compute (attention, KV cache, MLP), but write 10x less into
            # the residual stream, so the chain's probabilities hold to about 1%.
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.mul_(LAYER_OUTPUT_SCALE)
                layer.mlp.down_proj.weight.mul_(LAYER_OUTPUT_SCALE)
    model.to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)
    write_generation_config(out)
    write_tokenizer(out)
    (out / MANIFEST).write_text(json.dumps(
        {"kind": kind, "builder": builder_hash(), **card}, indent=1))
    return out


def cache_root() -> Path:
    return Path(os.environ.get("RAYGEN_MODEL_CACHE") or REPO / ".local" / "models")


def ensure(kind: str, root: Path | None = None) -> Path:
    """The folder of model ``kind``, built first if missing or from another builder."""
    root = Path(root or cache_root())
    path = root / kind
    try:
        if json.loads((path / MANIFEST).read_text())["builder"] == builder_hash():
            return path
    except (OSError, ValueError, KeyError):
        pass
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=root))
    build(kind, staging / kind)
    stale = root / f".{kind}-stale-{os.getpid()}"
    if path.exists():
        path.rename(stale)
    try:
        (staging / kind).rename(path)
    except OSError:  # another builder renamed its copy first: theirs is the same model
        pass
    shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(stale, ignore_errors=True)
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--cache", help="cache folder (default $RAYGEN_MODEL_CACHE or "
                        ".local/models)")
    args = parser.parse_args(argv)
    print(ensure(args.kind, Path(args.cache) if args.cache else None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
