"""Arrow schemas of a run's files: data/ (completions), failures/, rejects/.

Explicit schemas keep every Parquet file of a run identical in types, even a file
whose rows all lack a value. README.md "Output schema" documents each column.
"""

from __future__ import annotations

import pyarrow as pa

TOKEN_IDS = pa.list_(pa.int32())
TIMESTAMP = pa.timestamp("ms", tz="UTC")

DATA = pa.schema([
    ("key", pa.string()),            # stable row key: input id, else hash of the prompt
    ("id", pa.string()),             # the input id (None when the input had none)
    ("version", pa.int32()),         # 0 = first generation, +1 per continuation
    ("category", pa.string()),
    ("messages", pa.string()),       # the prompt messages, JSON (OpenAI chat format)
    ("tools", pa.string()),          # the tools, JSON, or None
    ("reasoning", pa.string()),      # text before </think>
    ("answer", pa.string()),         # text after </think> ("" if cut while thinking)
    ("finished_thinking", pa.bool_()),
    ("prompt_token_ids", TOKEN_IDS),
    ("output_token_ids", TOKEN_IDS),
    ("finish_reason", pa.string()),  # stop | length | abort
    ("matched_stop", pa.string()),   # stop string or stop token id, as text
    ("prompt_tokens", pa.int32()),
    ("completion_tokens", pa.int32()),   # all output tokens of the row (all versions)
    ("cached_tokens", pa.int32()),
    ("reasoning_tokens", pa.int32()),
    ("max_new_tokens", pa.int32()),      # total budget the row ran under (its last version)
    ("effective_max_new_tokens", pa.int32()),  # after the context guard
    ("budget_clamped_by", pa.string()),  # "" | context_guard | engine
    ("budget_history", pa.list_(pa.int32())),  # budgets of every version, oldest first
    ("continuations", pa.int32()),
    ("spec_verify_ct", pa.int64()),
    ("accept_length", pa.float64()),     # completion_tokens / spec_verify_ct
    ("repetition_ratio", pa.float64()),  # share of repeated 4-grams in the output ids
    ("latency_s", pa.float64()),
    ("attempts", pa.int32()),
    ("retry_classes", pa.list_(pa.string())),  # error class of each retried attempt
    ("replica", pa.string()),
    ("model", pa.string()),
    ("sampling", pa.string()),           # JSON of the sampling params sent
    ("settings_hash", pa.string()),      # hash of model + sampling + chat format
    ("created_at", TIMESTAMP),
    ("prompt_hash", pa.string()),        # hash of the canonical prompt (edits under an id)
])

FAILURES = pa.schema([
    ("key", pa.string()), ("id", pa.string()), ("category", pa.string()),
    ("messages", pa.string()), ("tools", pa.string()),
    ("source", pa.string()), ("line", pa.int64()),
    ("error_class", pa.string()), ("error_message", pa.string()),
    ("retryable", pa.bool_()), ("attempts", pa.int32()),
    ("retry_classes", pa.list_(pa.string())),
    ("replica", pa.string()), ("settings_hash", pa.string()), ("failed_at", TIMESTAMP),
])

REJECTS = pa.schema([
    ("source", pa.string()), ("line", pa.int64()),
    ("key", pa.string()), ("id", pa.string()),
    ("reason", pa.string()), ("raw", pa.string()), ("rejected_at", TIMESTAMP),
    ("reject_id", pa.string()),  # content identity: the same bad line is one reject
])

KINDS = {"data": DATA, "failures": FAILURES, "rejects": REJECTS}
# Columns added after runs were first written: a part that predates one reads it as
# nulls (jobs/io/run_store.py); any other missing column makes the part damaged.
LATER_COLUMNS = frozenset({"prompt_hash", "reject_id"})

# What flows from the generate stage to the sink: every column of every kind plus the
# row's destination.
STAGE_OUTPUT = pa.schema(
    [("_kind", pa.string())]
    + list({f.name: f for schema in KINDS.values() for f in schema}.values()))
