"""Integrity flags: outputs an engine can break silently, named on each data/ row.

Engines have returned empty outputs and token-id loops that still finish as success
(hybrid models with MTP drafting and the radix cache: vLLM #43650, SGLang #36537). A
drafter trained on them learns the breakage. Each data row gets the list of flags its
output raises (``integrity_flags``; empty = sound), computed when it is written, over
the whole output (a continued row: all its versions' tokens). Export leaves flagged rows
out unless asked (jobs/analysis/export.py) and counts them in its manifest; a replica
whose recent outputs are mostly flagged drains itself (serve_apps/output_watch.py).
Here, in contract/, because both sides judge outputs with the same function.

The flags (each a row-local test, no state across rows):

- ``empty_answer``: finished by ``stop`` after thinking, with no answer text.
- ``missing_think_end``: finished by ``stop`` while still thinking (``</think>`` never
  came: the whole output is reasoning). Never a row of job.sampling.thinking false: its
  prompt closed the thinking, so its finished_thinking is true (chat_format.no_thinking).
- ``token_run``: one token id repeated ``TOKEN_RUN`` times in a row.
- ``ngram_loop``: at least ``LOOP_MIN_TOKENS`` output tokens of which ``LOOP_RATIO`` or
  more repeat an earlier 4-gram (``repetition_ratio``).
- ``replacement_char``: U+FFFD in the text (bytes the tokenizer could not decode).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

TOKEN_RUN = 64
LOOP_MIN_TOKENS = 256
LOOP_RATIO = 0.9
FLAGS = ("empty_answer", "missing_think_end", "token_run", "ngram_loop", "replacement_char")


def repetition_ratio(ids: Sequence[int], n: int = 4) -> float:
    """Share of n-grams in the output that repeat an earlier one (0 = none, ~1 = loop)."""
    total = len(ids) - n + 1
    if total <= 0:
        return 0.0
    # zip over n shifted views: no per-window slice, ~3x less CPU than tuple(ids[i:i+n])
    return 1.0 - len(set(zip(*(ids[i:] for i in range(n))))) / total


def longest_run(ids: Optional[list[int]]) -> int:
    """Length of the longest run of one repeated token id."""
    best = run = 0
    previous = None
    for token in ids or ():
        run = run + 1 if token == previous else 1
        previous = token
        best = max(best, run)
    return best


def integrity_flags(row: dict[str, Any]) -> list[str]:
    """The flags of a data row (its columns as written: finish_reason, reasoning,
    answer, finished_thinking, output_token_ids, repetition_ratio)."""
    flags = []
    stopped = row.get("finish_reason") == "stop"
    if stopped and row.get("finished_thinking") and not (row.get("answer") or "").strip():
        flags.append("empty_answer")
    if stopped and row.get("finished_thinking") is False:
        flags.append("missing_think_end")
    ids = row.get("output_token_ids") or []
    if longest_run(ids) >= TOKEN_RUN:
        flags.append("token_run")
    if len(ids) >= LOOP_MIN_TOKENS and (row.get("repetition_ratio") or 0.0) >= LOOP_RATIO:
        flags.append("ngram_loop")
    if "\ufffd" in (row.get("reasoning") or "") or "\ufffd" in (row.get("answer") or ""):
        flags.append("replacement_char")
    return flags
