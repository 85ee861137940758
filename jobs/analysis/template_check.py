"""The trainer round trip (`raygen export ... --check-template TOKENIZER`): will the
trainer see the tokens the model sampled?

SpecForge and speculators re-tokenize a `conversations`/`messages` record: transformers'
`tokenizer.apply_chat_template(turns, tools=tools, tokenize=True)` over the prompt turns
plus `{"role": "assistant", "content": answer, "reasoning_content": reasoning}`. Each
exported row is rendered that way here and compared with the ids the model saw and
produced: `prompt_token_ids + output_token_ids` from data/ (the prompt as raygen rendered
and tokenized it, generation prompt included; every sampled id, the stop token that
ended a `stop` row included, e.g. `<|im_end|>`, and the ids of a matched stop string).
The drafter learns to predict the target's tokens from the target's hidden states on
its own ids: a record that re-renders to other ids (a template that drops the reasoning,
adds newlines around `</think>`, a tokenizer that merges what the model sampled as two
tokens, a stop string the text lost) trains it on what the model does not do.

Each row is one of:
- `match`: the rendering equals the ids, or extends them after a `stop` row's last id
  (the template's text after the end of turn, e.g. Qwen's `\\n` after `<|im_end|>`:
  generation ends at the stop token, so nothing is predicted there at serving time);
- `prompt`: the first difference is inside prompt_token_ids (a negative `output_offset`
  of a few tokens is the generation prompt, e.g. the `<think>\\n` raygen's template
  opens and the trainer's does not);
- `output`: the first difference is inside output_token_ids (`same_text` says when the
  decoded text agrees and only the tokenization differs);
- `end_added`: a row cut at the budget (`length`) whose rendering goes on past the cut:
  the template closes the turn (`</think>`, `<|im_end|>`) where the model did not;
- `shorter`: the rendering stops before the ids do (the template leaves tokens out);
- `render_error`: the template raised (the trainer would fail or skip the row).

Design decisions:
- The check sees exactly the records the export writes (the export calls `add` with
  each data file's kept rows, after every filter) and keeps only counts and one example
  per row category: memory stays one data file.
- Rendering is per row (tools differ), tokenizing is batched per chunk of rows:
  `tokenize=True` is `tokenizer(rendered, add_special_tokens=False)`, so the ids are the
  same (a test holds the two equal).
- Refusal: a share of mismatched rows above `--max-template-mismatch` (default 1%) ends
  the export without a manifest and without shards, unless `--allow-template-mismatch`;
  `--format pretokenized` has no such failure mode (the trainer takes the ids
  themselves), so the check refuses to run for it.
- transformers is imported when the check is asked for, never by the export otherwise.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any, Callable, Optional

import numpy as np
import pyarrow as pa

from jobs.config import ConfigError, load_config

KINDS = ("prompt", "output", "end_added", "shorter", "render_error")
DEFAULT_MAX_SHARE = 0.01
MODEL = "model"          # --check-template model: the run config's engine.model_path
WINDOW = 8               # tokens of context each side of the first difference in an example
CHUNK = 256              # rows tokenized in one batch
COLUMNS = ["key", "category", "finish_reason", "messages", "tools", "reasoning", "answer",
           "prompt_token_ids", "output_token_ids"]


PRETOKENIZED = ("--check-template applies to --format conversations/messages: pretokenized "
                "records are the sampled ids themselves, nothing is re-rendered")


class TemplateCheckError(ValueError):
    """The check cannot run as asked (the message names the flag)."""


def resolve_source(source: str, config_path: Optional[str]) -> str:
    """`model` -> the config's engine.model_path; a path as given otherwise."""
    if source != MODEL:
        return source
    if not config_path:
        raise TemplateCheckError(
            "--check-template model needs --config FILE: the model is the config's "
            "engine.model_path (or give a tokenizer folder instead of `model`)")
    try:
        engine = load_config(config_path).engine
    except ConfigError as exc:
        raise TemplateCheckError(f"--check-template model: {' '.join(str(exc).split())}") from None
    if engine.kind != "sglang":
        raise TemplateCheckError(
            f"--check-template model: the config's engine is the {engine.kind} "
            f"({engine.model_path}), which has no tokenizer folder; give the tokenizer "
            f"folder the trainer will use")
    return engine.model_path


def load_tokenizer(path: str) -> Any:
    """AutoTokenizer from a local folder (or a model already in the HF cache); no network."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise TemplateCheckError("--check-template needs transformers (pip install "
                                 "transformers): it renders records as the trainers do") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # OSError, HF validation, a broken tokenizer.json: one line
        where = "folder" if os.path.isdir(path) else "path (no such folder here)"
        raise TemplateCheckError(f"--check-template {path}: cannot load a tokenizer from this "
                                 f"{where}: {' '.join(str(exc).split())[:300]}") from None
    if not getattr(tokenizer, "chat_template", None):
        raise TemplateCheckError(f"--check-template {path}: the tokenizer has no chat template "
                                 f"(the trainers need one to render conversations)")
    return tokenizer


def first_difference(produced: np.ndarray, rendered: np.ndarray) -> int:
    """Length of the common prefix."""
    n = min(len(produced), len(rendered))
    diff = np.flatnonzero(produced[:n] != rendered[:n])
    return int(diff[0]) if diff.size else n


def classify(prompt_len: int, produced: np.ndarray, rendered: np.ndarray,
             finish_reason: str) -> tuple[str, int]:
    """(kind, position of the first difference); kind "match" when the trainer sees the ids."""
    pos = first_difference(produced, rendered)
    if pos == len(produced):
        if len(rendered) == pos or finish_reason == "stop":
            return "match", pos
        return "end_added", pos
    if pos == len(rendered):
        return "shorter", pos
    return ("prompt" if pos < prompt_len else "output"), pos


class TemplateCheck:
    """Counts how the exported rows re-render; `report()` for the manifest."""

    def __init__(self, tokenizer: Any, source: str, max_share: float = DEFAULT_MAX_SHARE,
                 allow: bool = False):
        if not 0 <= max_share <= 1:
            raise TemplateCheckError(f"--max-template-mismatch must be within 0..1, got {max_share}")
        self.tokenizer, self.source, self.max_share, self.allow = tokenizer, source, max_share, allow
        self.checked = 0
        self.kinds: Counter[str] = Counter()
        self.categories: dict[str, dict[str, Any]] = {}
        self.suffix_rows = 0
        self.suffix_example: Optional[str] = None

    @classmethod
    def load(cls, source: str, config_path: Optional[str] = None,
             max_share: float = DEFAULT_MAX_SHARE, allow: bool = False) -> "TemplateCheck":
        if not 0 <= max_share <= 1:
            raise TemplateCheckError(f"--max-template-mismatch must be within 0..1, got {max_share}")
        path = resolve_source(source, config_path)
        return cls(load_tokenizer(path), path, max_share, allow)

    @classmethod
    def from_args(cls, args: Any) -> Optional["TemplateCheck"]:
        """The check the export's flags ask for (None without --check-template)."""
        if args.check_template is None:
            for flag, given in (("--max-template-mismatch", args.max_template_mismatch is not None),
                                ("--allow-template-mismatch", args.allow_template_mismatch)):
                if given:
                    raise TemplateCheckError(f"{flag} needs --check-template TOKENIZER")
            return None
        if args.format == "pretokenized":
            raise TemplateCheckError(PRETOKENIZED)
        share = DEFAULT_MAX_SHARE if args.max_template_mismatch is None else args.max_template_mismatch
        return cls.load(args.check_template, args.config, share, args.allow_template_mismatch)

    # --- rendering ---------------------------------------------------------------------

    def render_text(self, turns: list[dict[str, Any]], tools: Optional[str]) -> str:
        parsed = json.loads(tools) if tools else None
        return self.tokenizer.apply_chat_template(turns, tools=parsed or None, tokenize=False)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    # --- counting ----------------------------------------------------------------------

    def add(self, t: pa.Table, turns: Callable[[dict[str, Any]], list[dict[str, Any]]]) -> None:
        """The rows the export writes from one data file; `turns` builds a record's turns."""
        rows = t.select(COLUMNS).to_pylist()
        for start in range(0, len(rows), CHUNK):
            self._add_chunk(rows[start:start + CHUNK], turns)

    def _add_chunk(self, rows: list[dict[str, Any]], turns: Callable) -> None:
        texts, errors = [], {}
        for i, row in enumerate(rows):
            try:
                texts.append(self.render_text(turns(row), row["tools"]))
            except Exception as exc:  # a template raising is a finding, not a crash
                errors[i] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
                texts.append("")
        encoded = self.encode(texts)
        for i, (row, rendered) in enumerate(zip(rows, encoded)):
            self._count(row, rendered, errors.get(i))

    def _count(self, row: dict[str, Any], rendered_ids: list[int], error: Optional[str]) -> None:
        prompt = row["prompt_token_ids"]
        produced = np.asarray(prompt + row["output_token_ids"], dtype=np.int64)
        rendered = np.asarray(rendered_ids, dtype=np.int64)
        kind, pos = ("render_error", 0) if error else classify(
            len(prompt), produced, rendered, row["finish_reason"])
        self.checked += 1
        cat = self.categories.setdefault(str(row["category"]), {"checked": 0, "mismatched": 0,
                                                           "kinds": Counter(), "example": None})
        cat["checked"] += 1
        if kind == "match":
            if len(rendered) > len(produced):
                self.suffix_rows += 1
                if self.suffix_example is None:
                    self.suffix_example = self.decode(rendered[len(produced):])
            return
        self.kinds[kind] += 1
        cat["mismatched"] += 1
        cat["kinds"][kind] += 1
        if cat["example"] is None:
            cat["example"] = self._example(row, kind, pos, len(prompt), produced, rendered, error)

    def _example(self, row, kind, pos, prompt_len, produced, rendered, error) -> dict[str, Any]:
        if error:  # nothing was rendered
            return {"key": row["key"], "kind": kind, "error": error}
        lo = max(0, pos - WINDOW)
        out = {"key": row["key"], "kind": kind, "position": pos,
               "output_offset": pos - prompt_len,
               "produced_id": int(produced[pos]) if pos < len(produced) else None,
               "rendered_id": int(rendered[pos]) if pos < len(rendered) else None,
               "produced": self.decode(produced[lo:pos + WINDOW]),
               "rendered": self.decode(rendered[lo:pos + WINDOW])}
        if kind == "output":
            # the rendered text goes on from the produced text: only the ids differ
            out["same_text"] = self.decode(rendered[prompt_len:]).startswith(
                self.decode(produced[prompt_len:]))
        return out

    # --- verdict -----------------------------------------------------------------------

    @property
    def mismatched(self) -> int:
        return sum(self.kinds.values())

    @property
    def share(self) -> float:
        return self.mismatched / self.checked if self.checked else 0.0

    def refused(self) -> bool:
        return self.share > self.max_share and not self.allow

    def report(self) -> dict[str, Any]:
        cats = {}
        for name in sorted(self.categories):
            c = self.categories[name]
            cats[name] = {"checked": c["checked"], "mismatched": c["mismatched"],
                          "share": round(c["mismatched"] / c["checked"], 6),
                          "kinds": dict(sorted(c["kinds"].items())), "example": c["example"]}
        return {"tokenizer": self.source, "checked": self.checked,
                "mismatched": self.mismatched, "share": round(self.share, 6),
                "max_share": self.max_share, "allowed": self.allow,
                "passed": self.share <= self.max_share,
                "kinds": {k: self.kinds[k] for k in KINDS if self.kinds[k]},
                "end_of_turn_suffix": {"rows": self.suffix_rows, "text": self.suffix_example},
                "by_category": cats}

    def refusal(self) -> str:
        r = self.report()
        kinds = ", ".join(f"{k} {v:,}" for k, v in r["kinds"].items())
        return (f"--check-template {self.source}: {r['mismatched']:,} of {r['checked']:,} "
                f"rows ({r['share']:.2%}) re-render to other ids than the model produced "
                f"(by kind: {kinds}), over --max-template-mismatch {self.max_share:g}; "
                f"nothing written.\n"
                + "\n".join(render_lines(r)[1:]) +
                "\n  --format pretokenized avoids this (the trainer takes the sampled ids "
                "themselves); --allow-template-mismatch writes this format anyway")


def _short(text: Optional[str], limit: int = 120) -> str:
    return json.dumps(text if text is None or len(text) <= limit else text[:limit] + "...",
                      ensure_ascii=False)


def render_lines(r: Optional[dict[str, Any]]) -> list[str]:
    """The check's lines in the export summary (none when the check did not run)."""
    if not r:
        return []
    kinds = ", ".join(f"{k} {v:,}" for k, v in r["kinds"].items()) or "none"
    verdict = "ok" if r["passed"] else ("over the limit, written anyway "
                                       "(--allow-template-mismatch)" if r["allowed"] else "refused")
    lines = [f"  template: {r['mismatched']:,} of {r['checked']:,} rows differ "
             f"({r['share']:.2%}, limit {r['max_share']:.2%}: {verdict}) with {r['tokenizer']}"
             f"; by kind: {kinds}"]
    for name, c in r["by_category"].items():
        if not c["mismatched"]:
            continue
        e = c["example"]
        head = f"    {name}: {c['mismatched']:,}/{c['checked']:,} ({c['share']:.1%}); e.g. {e['key']}"
        if e.get("error"):
            lines.append(f"{head} ({e['kind']}): {e['error']}")
            continue
        lines.append(f"{head} ({e['kind']}) at id {e['position']} (output offset "
                     f"{e['output_offset']})" + (", same text" if e.get("same_text") else ""))
        lines.append(f"      produced {_short(e['produced'])}")
        lines.append(f"      rendered {_short(e['rendered'])}")
    return lines
