"""Deterministic generation model of the simulated engine. Pure functions, no I/O.

Design decisions:
- Prompt boundary: the prompt "core" is the input up to and including the
  LAST "<|im_start|>assistant\\n" (the whole input if absent). Everything
  after it is the response *stream*: stream positions 0-1 are "<think>\\n",
  whether the chat template put them in the prompt or the model generates
  them. So a prompt ending in "<think>\\n" and a continuation whose earlier
  output started with "<think>\\n" land on the same stream positions and the
  same tokens; continuation never shifts the prompt hash.
- Per-prompt plan from blake2b(core ids [+ the request's sampling_seed]): natural length L (lognormal via
  inverse CDF; L counts stream tokens and includes the EOS), the </think>
  position (0.6-0.9 of L) and the request's speculative accept length.
- Next-token rule: a 64-bit FNV-1a style rolling hash over ids (seeded by the
  core digest) picks a word; structural positions (<think>, </think>, "\\n\\n",
  EOS at L-1) are fixed by stream position. Each token is thus a function of
  the token prefix alone, so continuing from prompt + first k output tokens
  reproduces tokens k.. of a single long run exactly.
- Speed: the whole output is generated at admission in tight word loops
  between the few structural positions (well under 1 us per token in CPython).
- Finish order mirrors SGLang's Req.update_finish_state: stop strings first, then
  EOS / stop_token_ids (skipped with ignore_eos), then length (an EOS on the last
  allowed token is a stop, not a length finish).
- min_new_tokens defers the EOS and ignores stop matches before that many
  tokens (SGLang masks stop tokens there).
- A thinking budget B (max_thinking_tokens, under strict thinking) puts </think> at
  the request's output token B when the plan's comes later, as SGLang's grammar forces
  it; the answer that follows keeps the plan's length (</think> to EOS), so the EOS
  moves up with it. The EOS is placed from wherever </think> is in the stream, so a
  continuation of a cut run still ends where the single run does.
- A sampling_seed joins the core's digest (plan and word hash): seeds draw different
  samples of one prompt; no seed is the unseeded plan as before. A continuation sent
  with the same seed goes on exactly, as without one.
"""

from __future__ import annotations

import math
from array import array
import struct
from bisect import bisect_left
from dataclasses import dataclass
from hashlib import blake2b
from itertools import accumulate
from statistics import NormalDist
from typing import Any, Sequence

from serve_apps.engines.simulator import tokenizer as tk

FNV_PRIME = 0x100000001B3
MASK64 = (1 << 64) - 1
MIN_LENGTH_TOKENS = 8  # room for "<think>\n", one thought, "</think>\n\n", one word, EOS
MAX_LENGTH_TOKENS = 1 << 20
MAX_LOG_SHIFT = 1.5
THINK_FRACTION_RANGE = (0.6, 0.9)
ACCEPT_JITTER = 0.5
_NORMAL = NormalDist()
_NUM_WORDS = len(tk.WORDS)
_THINK_START, _THINK_END, _NL, _EOS = tk.THINK_START_ID, tk.THINK_END_ID, tk.NEWLINE_ID, tk.EOS_ID


@dataclass(frozen=True, slots=True)
class LengthParams:
    """Parameters of the natural-length distribution and speculative acceptance."""

    median_tokens: float = 2270.0
    sigma: float = 0.645
    prompt_coupling: float = 0.0
    accept_length: float = 3.0  # <= 1 means speculative decoding off


@dataclass(frozen=True, slots=True)
class Plan:
    """What a prompt core determines: everything except the per-token words."""

    core_tokens: int  # prompt length used for coupling and reported as the prompt core
    length: int  # natural stream length L including the EOS at stream position L-1
    think_end_pos: int  # stream position of </think>
    accept_length: float | None  # per-request mean accept length; None when speculative is off
    seed_hash: int  # rolling-hash state right after the core


@dataclass(frozen=True, slots=True)
class Generation:
    output_ids: list[int]
    text: str
    finish_reason: dict[str, Any]
    reasoning_tokens: int
    plan: Plan


def core_length(ids: Sequence[int]) -> int:
    """Index just past the last assistant marker, or len(ids) when there is none."""
    marker = list(tk.ASSISTANT_MARKER)
    m = len(marker)
    rev = ids[::-1] if isinstance(ids, list) else list(ids)[::-1]
    j = 0
    # Walk <|im_start|> occurrences from the end (C-speed list.index on the reversed copy).
    while True:
        try:
            j = rev.index(tk.IM_START_ID, j)
        except ValueError:
            return len(ids)
        start = len(ids) - 1 - j
        if list(ids[start : start + m]) == marker:
            return start + m
        j += 1


def _uniform(word: int) -> float:
    return (word + 0.5) / 2.0**64  # strictly inside (0, 1): inv_cdf is finite


def make_plan(core: Sequence[int], params: LengthParams, sampling_seed: int | None = None) -> Plan:
    data = array("q", core).tobytes()
    if sampling_seed is not None:
        data += b"seed" + sampling_seed.to_bytes(8, "little", signed=True)
    digest = blake2b(data, digest_size=32).digest()
    seed, w_len, w_think, w_acc = (int.from_bytes(digest[i : i + 8], "little") for i in range(0, 32, 8))
    shift = 0.0
    if params.prompt_coupling and core:
        shift = params.prompt_coupling * math.log2(len(core) / 256.0)
        shift = max(-MAX_LOG_SHIFT, min(MAX_LOG_SHIFT, shift))
    log_len = math.log(params.median_tokens) + shift + params.sigma * _NORMAL.inv_cdf(_uniform(w_len))
    length = int(round(math.exp(min(log_len, math.log(MAX_LENGTH_TOKENS)))))
    length = max(MIN_LENGTH_TOKENS, min(MAX_LENGTH_TOKENS, length))
    lo, hi = THINK_FRACTION_RANGE
    think = int((lo + (hi - lo) * _uniform(w_think)) * length)
    think = max(2, min(length - 4, think))  # keep "\n\n" + >=1 answer word before the EOS
    accept = None
    if params.accept_length > 1.0:
        accept = max(1.0, params.accept_length + ACCEPT_JITTER * (2.0 * _uniform(w_acc) - 1.0))
    return Plan(len(core), length, think, accept, seed)


def roll(h: int, ids: Sequence[int]) -> int:
    """Advance the rolling hash over ids."""
    for tok in ids:
        h = ((h ^ tok) * FNV_PRIME) & MASK64
    return h


def _words(h: int, n: int, out: list[int]) -> int:
    """Append n hash-chosen word ids; the hot loop, kept free of attribute lookups."""
    append, base, nw, prime, mask = out.append, tk.WORD_BASE, _NUM_WORDS, FNV_PRIME, MASK64
    for _ in range(n):
        tok = base + (h >> 29) % nw
        append(tok)
        h = ((h ^ tok) * prime) & mask
    return h


def emit(plan: Plan, h: int, start: int, n: int, eos_pos: int | None, think_done: bool,
         think_pos: int | None = None) -> list[int]:
    """Stream tokens at positions start..start+n-1 given the hash state h of the prefix;
    </think> at think_pos (default: the plan's), unless the prefix holds it already."""
    fixed = {0: _THINK_START, 1: _NL}
    if not think_done:
        t = plan.think_end_pos if think_pos is None else think_pos
        fixed.update({t: _THINK_END, t + 1: _NL, t + 2: _NL})
    if eos_pos is not None:
        fixed[eos_pos] = _EOS
    end = start + n
    out: list[int] = []
    pos = start
    for p in sorted(q for q in fixed if start <= q < end):
        h = _words(h, p - pos, out)
        tok = fixed[p]
        out.append(tok)
        h = ((h ^ tok) * FNV_PRIME) & MASK64
        pos = p + 1
    _words(h, end - pos, out)
    return out


def _stop_string_hit(out: list[int], stops: Sequence[str], first_idx: int, skip_special: bool) -> tuple[int, str] | None:
    """Earliest (token index, stop string) at which the decoded output contains a stop string."""
    if not stops or first_idx >= len(out):
        return None
    # Generated ids are specials, ASCII bytes and words, so per-token pieces concatenate exactly.
    ends = list(accumulate(len(tk.token_piece(t, skip_special)) for t in out))
    text = tk.decode(out, skip_special)
    best: tuple[int, str] | None = None
    for s in stops:
        occ = text.find(s)
        if occ < 0:
            continue
        idx = max(bisect_left(ends, occ + len(s)), first_idx)
        if best is None or idx < best[0]:
            best = (idx, s)
    return best


def _stop_token_hit(out: list[int], stop_ids: frozenset[int], first_idx: int) -> int | None:
    for i in range(first_idx, len(out)):
        if out[i] in stop_ids:
            return i
    return None


def _finish(out: list[int], max_new: int, min_new: int, stops: Sequence[str], stop_ids: frozenset[int], skip_special: bool):
    """(cut index or None, finish_reason) following Req.update_finish_state's order at each token:
    stop string, then stop token/EOS, then length (schedule_batch.py)."""
    first = max(min_new - 1, 0)
    tok_i = _stop_token_hit(out, stop_ids, first) if stop_ids else None
    str_hit = _stop_string_hit(out, stops, first, skip_special)
    str_i = str_hit[0] if str_hit else None
    if str_i is not None and (tok_i is None or str_i <= tok_i):
        return str_i, {"type": "stop", "matched": str_hit[1]}
    if tok_i is not None:
        return tok_i, {"type": "stop", "matched": out[tok_i]}
    return None, {"type": "length", "length": max_new}


def generate(
    input_ids: Sequence[int],
    params: LengthParams,
    max_new_tokens: int,
    *,
    min_new_tokens: int = 0,
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    ignore_eos: bool = False,
    skip_special_tokens: bool = True,
    no_stop_trim: bool = False,
    max_thinking_tokens: int | None = None,
    sampling_seed: int | None = None,
) -> Generation:
    """The deterministic response to input_ids under SGLang's stopping rules.
    ``max_thinking_tokens``: the request's thinking budget, as SGLang enforces it (only
    sent when the request counts as thinking: require_reasoning under strict thinking)."""
    k = core_length(input_ids)
    plan = make_plan(input_ids[:k], params, sampling_seed)
    stream = input_ids[k:]
    start = len(stream)
    h = roll(plan.seed_hash, stream)
    think_done = _THINK_END in stream
    think_pos = stream.index(_THINK_END) if think_done else plan.think_end_pos
    if not think_done and max_thinking_tokens is not None:
        think_pos = min(think_pos, start + max_thinking_tokens)
    eos_pos = None
    if not ignore_eos:
        # Past the natural end (e.g. continuing an ignore_eos run) the model stops at once.
        natural_end = think_pos + plan.length - 1 - plan.think_end_pos
        eos_pos = max(natural_end, start + max(min_new_tokens, 1) - 1)
    n = max_new_tokens if eos_pos is None else min(max_new_tokens, eos_pos - start + 1)
    out = emit(plan, h, start, max(n, 0), eos_pos, think_done, think_pos)
    stop_ids = frozenset() if ignore_eos else frozenset(stop_token_ids) | {_EOS}
    stops = [stop] if isinstance(stop, str) else list(stop)
    cut, reason = _finish(out, max_new_tokens, min_new_tokens, stops, stop_ids, skip_special_tokens)
    if cut is not None:
        del out[cut + 1 :]
    matched = reason.get("matched")
    # SGLang's detokenizer drops the matched stop token / cuts before the stop string.
    trim_token = isinstance(matched, int) and not no_stop_trim
    text = tk.decode(out[:-1] if trim_token else out, skip_special_tokens)
    if isinstance(matched, str) and not no_stop_trim:
        text = text[: text.find(matched)]
    reasoning = 0 if think_done else max(0, min(start + len(out), think_pos + 1) - start)
    return Generation(out, text, reason, reasoning, plan)


def natural_output_length(input_ids: Sequence[int], params: LengthParams) -> int:
    """Output tokens (incl. EOS) the model produces with no cap, for a prompt without continuation."""
    k = core_length(input_ids)
    plan = make_plan(input_ids[:k], params)
    return max(plan.length - len(input_ids[k:]), 1)


def spec_fields(completion_tokens: int, accept_length: float | None, num_draft_tokens: int = 4) -> dict[str, float | int]:
    """meta_info speculative fields as TokenizerManager builds them; empty when speculative decoding is off.

    Each verify step accepts some drafts plus one bonus token, so correct drafts =
    completion - verify; proposed = verify * (num_draft_tokens - 1).
    """
    if accept_length is None:
        return {}
    verify = max(1, math.ceil(completion_tokens / accept_length))
    proposed = verify * (num_draft_tokens - 1)
    if proposed <= 0:
        return {}
    correct = max(0, completion_tokens - verify)
    return {
        "spec_accept_rate": correct / proposed,
        "spec_accept_length": completion_tokens / verify,
        "spec_num_correct_drafts": correct,
        "spec_num_proposed_drafts": proposed,
        "spec_verify_ct": verify,
    }


TOP_STEP = 0.75  # logprob gap between neighbouring alternatives
_F32 = struct.Struct("f")


def _f32(x: float) -> float:
    """x rounded to float32, as SGLang's logprobs are (float32 tensors, sent as floats)."""
    return _F32.unpack(_F32.pack(x))[0]


def logprobs(input_len: int, output_ids: Sequence[int], top_k: int) -> dict[str, Any]:
    """The meta_info logprob fields SGLang 0.5.23 sends with ``return_logprob`` (no text:
    return_text_in_logprobs false): per output token [logprob, id, None] and, top_k > 0,
    its top_k alternatives sorted by logprob, the sampled token among them or below them.
    Deterministic in each token and its position in the whole sequence (input + output),
    so a continuation (prompt + earlier output sent as input) gets the one-shot values."""
    sampled, tops = [], []
    for i, token in enumerate(output_ids):
        pos = input_len + i
        h = ((token * 0x9E3779B1) ^ (pos * 0x85EBCA77)) & 0xFFFF
        top1 = h % 3 != 0  # two tokens in three are the model's first choice
        lp = _f32(-(h / 0xFFFF) * (0.7 if top1 else 2.3) - (0.0 if top1 else 0.7))
        sampled.append([lp, token, None])
        if top_k:
            # Alternatives: other ids, below the sampled one (one above it when it was not
            # the first choice); the top_k best, the sampled token included when it ranks.
            alts = [((token + j) % tk.VOCAB_SIZE, _f32(lp - TOP_STEP * j)) for j in range(1, top_k + 1)]
            if not top1:
                alts[0] = (alts[0][0], _f32(lp / 2))
            ranked = sorted([(token, lp)] + alts, key=lambda t: -t[1])[:top_k]
            tops.append([[v, t, None] for t, v in ranked])
    out: dict[str, Any] = {"input_token_logprobs": [], "output_token_logprobs": sampled,
                           "output_token_logprobs_length": len(sampled)}
    if top_k:
        out.update(input_top_logprobs=[], output_top_logprobs=tops)
    return out
