"""Deterministic toy tokenizer of the simulated engine.

Design decisions:
- Id layout: 7 special tokens (0-6), then the 256 UTF-8 bytes, then a small
  word vocabulary. ``encode`` never emits word ids: text becomes special ids
  plus byte ids, so ANY text round-trips exactly. Word ids exist so the
  simulated model can emit cheap, readable output (" word" per id).
- Special strings are matched greedily with one compiled regex, so a prompt
  that spells "<|im_start|>" gets the single special id, like a real chat
  tokenizer with added tokens.
- Like Qwen3, ``<think>``/``</think>``/``<tool_call>``/``</tool_call>`` are
  ordinary added tokens: ``skip_special_tokens`` does NOT drop them; it only
  drops ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``.
"""

from __future__ import annotations

import re
from typing import Iterable

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>")
SPECIAL_IDS = {text: i for i, text in enumerate(SPECIAL_TOKENS)}
ENDOFTEXT_ID = SPECIAL_IDS["<|endoftext|>"]
IM_START_ID = SPECIAL_IDS["<|im_start|>"]
IM_END_ID = SPECIAL_IDS["<|im_end|>"]
THINK_START_ID = SPECIAL_IDS["<think>"]
THINK_END_ID = SPECIAL_IDS["</think>"]
EOS_ID = IM_END_ID  # Qwen chat models stop on <|im_end|>
# Dropped by decode(skip_special_tokens=True); the think/tool tags are kept.
SKIPPABLE_IDS = frozenset({ENDOFTEXT_ID, IM_START_ID, IM_END_ID})

BYTE_BASE = len(SPECIAL_TOKENS)
WORD_BASE = BYTE_BASE + 256

_WORD_TEXT = """
the of and to in is that for it as with was on be by this are at from or an have not which but they
his her she he we you all their has one were can there been if more when will would who so no out up
into than them only other its time new some could these two may first then do any like my now over such
our man me even most made after also did many before must through back years where much your way well
down should because each just those people how too little state good very make world still own see men
work long get here between both life being under never day same another know while last might us great
old year off come since against go came right used take three however small part found general high
again upon every few order number public although case system group point fact end set water house
value data list file line code function class object string type return import self none true false
error test result model token request response server client engine batch queue node task job worker
input output prompt text answer question reason step first second third next final check compute sum
count index key map array table row column field record query cache memory disk network time date
start stop begin finish open close read write load save send receive call run build deploy update
delete create insert select filter sort merge split join parse format print log debug trace warn
info config option setting default param argument variable constant loop condition branch merge
thread process signal event handler callback future promise async await yield lambda module package
library version release path directory folder name size length width height depth weight score rate
speed limit max min total average mean median sample random seed hash block page chunk buffer stream
source target origin local remote global private public static dynamic simple complex basic advanced
fast slow early late small large big short tall low empty full valid invalid safe secure stable ready
let consider think therefore thus hence since given assume suppose note observe recall define prove
show verify solve derive compute evaluate estimate approximate simplify expand factor divide multiply
add subtract equal greater less positive negative zero one two three four five six seven eight nine ten
hundred thousand million number integer real complex vector matrix tensor graph tree edge vertex path
cycle set subset element member union intersection function domain range image limit derivative
integral series sequence term product quotient remainder prime even odd square root power exponent
log base digit decimal fraction ratio percent probability chance expected variance distribution
because although unless until whether either neither nor yet so both each every all none some many
few several most least more less much little enough quite rather very really almost nearly about
around above below behind beside beyond inside outside within without toward across along among
during before after between through throughout upon via per versus plus minus times over under again
def elif else try except finally raise assert pass break continue lambda async await yield print range
len dict tuple int float str bool bytes self cls init main args kwargs null undefined const var struct
enum trait impl pub fn mut match case switch interface extends implements override template typename
""".split()
# dict.fromkeys dedupes while keeping order, so word ids are stable across edits that only append.
WORDS: tuple[str, ...] = tuple(dict.fromkeys(_WORD_TEXT))
VOCAB_SIZE = WORD_BASE + len(WORDS)
NEWLINE_ID = BYTE_BASE + ord("\n")

_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_TOKENS) + ")")
# Decoded text of every non-byte id; byte ids are collected and UTF-8 decoded in runs.
_PIECES: tuple[str, ...] = SPECIAL_TOKENS + ("",) * 256 + tuple(" " + w for w in WORDS)


def encode(text: str) -> list[int]:
    """Text -> ids: special strings as single ids, everything else as UTF-8 byte ids."""
    ids: list[int] = []
    # re.split with a capturing group alternates plain text (even) and specials (odd).
    for i, part in enumerate(_SPECIAL_RE.split(text)):
        if i % 2:
            ids.append(SPECIAL_IDS[part])
        elif part:
            ids.extend([b + BYTE_BASE for b in part.encode("utf-8")])
    return ids


def decode(ids: Iterable[int], skip_special_tokens: bool = True) -> str:
    """Ids -> text. Raises ValueError on ids outside the vocabulary."""
    out: list[str] = []
    pending = bytearray()  # consecutive byte ids, decoded together so multi-byte chars survive
    for tok in ids:
        if BYTE_BASE <= tok < WORD_BASE:
            pending.append(tok - BYTE_BASE)
            continue
        if not 0 <= tok < VOCAB_SIZE:
            raise ValueError(f"token id {tok} is outside the vocabulary (size {VOCAB_SIZE})")
        if pending:
            out.append(pending.decode("utf-8", errors="replace"))
            pending.clear()
        if skip_special_tokens and tok in SKIPPABLE_IDS:
            continue
        out.append(_PIECES[tok])
    if pending:
        out.append(pending.decode("utf-8", errors="replace"))
    return "".join(out)


def token_piece(tok: int, skip_special_tokens: bool = True) -> str:
    """Text of a single non-byte id (or of an ASCII byte id); used for incremental stop-string checks."""
    if skip_special_tokens and tok in SKIPPABLE_IDS:
        return ""
    if BYTE_BASE <= tok < WORD_BASE:
        return bytes([tok - BYTE_BASE]).decode("utf-8", errors="replace")
    return _PIECES[tok]


ASSISTANT_MARKER_TEXT = "<|im_start|>assistant\n"
ASSISTANT_MARKER: tuple[int, ...] = tuple(encode(ASSISTANT_MARKER_TEXT))
THINK_PREFIX_TEXT = "<think>\n"
THINK_PREFIX: tuple[int, ...] = tuple(encode(THINK_PREFIX_TEXT))
