"""Arrow schemas of a run's files: data/ (completions), failures/, rejects/.

Explicit schemas keep every Parquet file of a run identical in types, even a file
whose rows all lack a value. docs/rows-and-schema.md "Output schema" documents each
column.
"""

from __future__ import annotations

import pyarrow as pa

from contract.protocol import RESULT_COLUMNS

TOKEN_IDS = pa.list_(pa.int32())
TIMESTAMP = pa.timestamp("ms", tz="UTC")
# job.logprobs: SGLang computes logprobs in float32, so float32 stores them exactly.
LOGPROBS = pa.list_(pa.float32())

# Parquet types of the result columns contract.protocol.GenerateResult declares.
ARROW_TYPES = {"string": pa.string(), "bool": pa.bool_(), "int32": pa.int32(),
               "int64": pa.int64(), "float64": pa.float64(), "token_ids": TOKEN_IDS,
               "logprobs": LOGPROBS, "top_ids": pa.list_(TOKEN_IDS),
               "top_logprobs": pa.list_(LOGPROBS)}

# One regenerated assistant turn (job.regenerate every_turn, jobs/pipeline/turns.py): what
# the model wrote (reasoning, answer, tool calls as parsed, its sampled ids) and where the
# turn lies in the row's prompt ids (span_start/span_end; null for the row's last turn,
# which is the row's output).
TURN = pa.struct([
    ("reasoning", pa.string()), ("answer", pa.string()),
    ("tool_calls", pa.string()),         # JSON [{"name", "arguments"}] the answer made; None = none
    ("finished_thinking", pa.bool_()), ("finish_reason", pa.string()),
    ("matched_stop", pa.string()), ("prompt_tokens", pa.int32()),
    ("completion_tokens", pa.int32()), ("cached_tokens", pa.int32()),
    ("output_token_ids", TOKEN_IDS), ("latency_s", pa.float64()), ("replica", pa.string()),
    ("span_start", pa.int32()), ("span_end", pa.int32()),
])

# The replica's result columns (contract.protocol.RESULT_COLUMNS; docs/rows-and-schema.md
# "Output schema" documents each) sit between the row's identity and what the job adds.
DATA = pa.schema([
    ("key", pa.string()),            # stable row key: input id, else hash of the prompt
    ("id", pa.string()),             # the input id (None when the input had none)
    ("version", pa.int32()),         # 0 = first generation, +1 per continuation
    ("category", pa.string()),
    ("messages", pa.string()),       # the prompt messages, JSON (OpenAI chat format)
    ("tools", pa.string()),          # the tools, JSON, or None
    *((name, ARROW_TYPES[kind]) for name, kind in RESULT_COLUMNS.items()),
    ("budget_history", pa.list_(pa.int32())),  # budgets of every version, oldest first
    ("continuations", pa.int32()),
    ("repetition_ratio", pa.float64()),  # share of repeated 4-grams in the output ids
    ("attempts", pa.int32()),
    ("retry_classes", pa.list_(pa.string())),  # error class of each retried attempt
    ("model", pa.string()),
    ("sampling", pa.string()),           # JSON of the sampling params sent
    ("settings_hash", pa.string()),      # hash of every setting that changes an output
    ("created_at", TIMESTAMP),
    ("prompt_hash", pa.string()),        # hash of the canonical prompt (edits under an id)
    ("integrity_flags", pa.list_(pa.string())),  # contract/integrity.py; [] = sound
    ("max_thinking_tokens", pa.int32()),  # the row's thinking budget; None = none sent
    ("sample", pa.int32()),  # job.samples_per_prompt > 1: 0..n-1 (jobs/io/samples.py); else None
    ("seed", pa.int64()),    # the sample's sampling_seed sent to the engine; None = none sent
    ("turns", pa.list_(TURN)),  # job.regenerate every_turn: the turns regenerated so far; else None
    ("turn_stop", pa.string()),  # every_turn: why the conversation ended (complete | length |
                                 # tool_calls_differ | error:<class>); None = more turns to go
    ("setting", pa.string()),  # a sampling mix: the name of the row's setting; None = the
                               # run's one setting (jobs/pipeline/sampling_mix.py)
])

FAILURES = pa.schema([
    ("key", pa.string()), ("id", pa.string()), ("category", pa.string()),
    ("messages", pa.string()), ("tools", pa.string()),
    ("source", pa.string()), ("line", pa.int64()),
    ("error_class", pa.string()), ("error_message", pa.string()),
    ("retryable", pa.bool_()), ("attempts", pa.int32()),
    ("retry_classes", pa.list_(pa.string())),
    ("replica", pa.string()), ("settings_hash", pa.string()), ("failed_at", TIMESTAMP),
    ("sample", pa.int32()),  # as in data/: None unless job.samples_per_prompt > 1
])

REJECTS = pa.schema([
    ("source", pa.string()), ("line", pa.int64()),
    ("key", pa.string()), ("id", pa.string()),
    ("reason", pa.string()), ("raw", pa.string()), ("rejected_at", TIMESTAMP),
    ("reject_id", pa.string()),  # content identity: the same bad line is one reject
])

KINDS = {"data": DATA, "failures": FAILURES, "rejects": REJECTS}
# job.logprobs' columns (contract.protocol.GenerateResult): null in a run without it.
LOGPROB_COLUMNS = ("output_logprobs", "output_top_logprob_ids", "output_top_logprobs")

# Columns added after runs were first written: a part that predates one reads it as
# nulls (jobs/io/run_store.py); any other missing column makes the part damaged.
LATER_COLUMNS = frozenset({"prompt_hash", "reject_id", "integrity_flags", "max_thinking_tokens",
                           "sample", "seed", "turns", "turn_stop", "setting",
                           *LOGPROB_COLUMNS})

# What flows from the generate stage to the sink: every column of data/ and failures/
# plus the row's destination (rejects never reach the stage: admission writes them).
STAGE_OUTPUT = pa.schema(
    [("_kind", pa.string())]
    + list({f.name: f for schema in (DATA, FAILURES) for f in schema}.values()))
