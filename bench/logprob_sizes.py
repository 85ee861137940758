"""Bytes per output token of a data part with job.logprobs off and at top_k 0, 5, 20.

    python -m bench.logprob_sizes [--rows 256] [--max-new-tokens 4096] [--vocab 151936]

Offline (no engine, no Ray): one part of ``--rows`` rows (job.rows_per_file's default)
whose outputs are the simulator's at story scale (demo-sim's lengths), written as the
sink writes parts (jobs/io/run_store.py: the data/ schema, zstd, page checksums), once
per setting. Logprob values are drawn to have a real model's entropy: float32 values of
a continuous distribution (their mantissas do not compress), the top alternatives sorted,
the sampled token the first choice 70% of the time, ids uniform over ``--vocab`` (Qwen3's
151,936 by default). "before" is the same part without the three columns (a part written
before job.logprobs existed): off costs what the null columns' metadata does.
"""

from __future__ import annotations

import argparse
import io
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contract.protocol import GenerateResult
from jobs.config import parse_config
from jobs.io.schema import DATA, LOGPROB_COLUMNS
from jobs.pipeline.rows import data_row, to_table
from jobs.pipeline.settings import StageSettings
from serve_apps.engines.simulator import model
from serve_apps.engines.simulator import tokenizer as tk

SETTINGS: tuple[Optional[int], ...] = (None, 0, 5, 20)  # None: off


CHAT = "<|im_start|>user\nquestion {}<|im_end|>\n<|im_start|>assistant\n<think>\n"


def base_table(rows: int, max_new: int) -> pa.Table:
    """The rows with logprobs off, as the generate stage makes them (rows.data_row) from
    the simulator's outputs."""
    params = model.LengthParams()
    stage = StageSettings.of(parse_config({
        "engine": {"kind": "simulator", "model_path": "sim-m", "context_length": 16384},
        "job": {"input": "p.jsonl", "output": "/tmp/o", "run_name": "r",
                "max_new_tokens": max_new}}))
    out = []
    for i in range(rows):
        prompt = tk.encode(CHAT.format(i))
        gen = model.generate(prompt, params, max_new)
        think = gen.text.find("</think>")
        result = GenerateResult(
            key=f"k{i:06d}", reasoning=gen.text[:max(think, 0)], answer=gen.text[think + 8:],
            finished_thinking=think >= 0, prompt_token_ids=prompt,
            output_token_ids=gen.output_ids, finish_reason=gen.finish_reason["type"],
            prompt_tokens=len(prompt), completion_tokens=len(gen.output_ids), cached_tokens=0,
            reasoning_tokens=gen.reasoning_tokens, max_new_tokens=max_new,
            effective_max_new_tokens=max_new, budget_clamped_by="", latency_s=1.0,
            replica="r0")
        row = {"key": result.key, "id": result.key, "category": "chat",
               "messages": f'[{{"role": "user", "content": "question {i}"}}]', "tools": None}
        out.append(data_row(row, result, stage, attempts=1))
    return to_table(out).select(DATA.names).cast(DATA)


def _lists(values: np.ndarray, offsets: np.ndarray) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values))


def with_logprobs(table: pa.Table, lengths: np.ndarray, top_k: int,
                  vocab: int, rng: np.random.Generator) -> pa.Table:
    n = int(lengths.sum())
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    k = max(top_k, 1)
    # Sorted top logprobs: the first choice near 0, the others spread below it.
    tops = -np.sort(rng.exponential(1.5, (n, k)), axis=1).astype(np.float32)
    tops[:, 0] = -rng.exponential(0.15, n).astype(np.float32)
    tops = -np.sort(-tops, axis=1)
    first = rng.random(n) < 0.7
    sampled = np.where(first, tops[:, 0], tops[:, 0] - rng.exponential(2.0, n)).astype(np.float32)
    columns = {"output_logprobs": _lists(sampled, offsets)}
    if top_k:
        ids = rng.integers(0, vocab, (n, top_k), dtype=np.int32)
        inner = np.arange(0, n * top_k + 1, top_k, dtype=np.int32)
        columns["output_top_logprob_ids"] = pa.ListArray.from_arrays(
            pa.array(offsets, pa.int32()), pa.ListArray.from_arrays(inner, pa.array(ids.ravel())))
        columns["output_top_logprobs"] = pa.ListArray.from_arrays(
            pa.array(offsets, pa.int32()),
            pa.ListArray.from_arrays(inner, pa.array(tops[:, :top_k].ravel())))
    for name, array in columns.items():
        table = table.set_column(table.schema.get_field_index(name), DATA.field(name),
                                 array.cast(DATA.field(name).type))
    return table


def part_bytes(table: pa.Table) -> int:
    """The part's size as the sink writes it (jobs/io/run_store.py write_part)."""
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", write_page_checksum=True)
    return len(buf.getvalue())


def measure(rows: int, max_new: int, vocab: int, seed: int = 0) -> list[tuple[str, int, float]]:
    """(setting, part bytes, bytes per output token) of each setting, and "before"."""
    off = base_table(rows, max_new)
    lengths = np.array(pc.list_value_length(off["output_token_ids"]).to_numpy())
    tokens = int(lengths.sum())
    found = [("before (no logprob columns)",
              part_bytes(off.drop_columns(list(LOGPROB_COLUMNS))))]
    for top_k in SETTINGS:
        table = off if top_k is None else with_logprobs(off, lengths, top_k, vocab,
                                                        np.random.default_rng(seed))
        found.append(("off" if top_k is None else f"top_k {top_k}", part_bytes(table)))
    return [(name, size, size / tokens) for name, size in found]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.logprob_sizes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=151_936)
    args = parser.parse_args(argv)
    results = measure(args.rows, args.max_new_tokens, args.vocab)
    tokens = results[0][1] / results[0][2]
    print(f"{args.rows} rows, {tokens:,.0f} output tokens (budget {args.max_new_tokens}), "
          f"vocab {args.vocab}; one zstd Parquet part as the sink writes it")
    base = results[1][2]
    print(f"{'setting':<28} {'part bytes':>12} {'bytes/token':>12} {'+ over off':>11}")
    for name, size, per_token in results:
        print(f"{name:<28} {size:>12,} {per_token:>12.2f} {per_token - base:>+11.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
