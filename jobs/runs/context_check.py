"""``--check-context``: before spending GPU hours, count how many prompts cannot get
their full budget inside the engine's context length.

Every valid prompt is rendered and tokenized by the engines themselves (the same
template and tokenizer the run will use), then compared with the room SGLang really
gives under ``context_length`` read from the running engine (contract.context_budget:
speculative reserve, scheduler input limit and clamp), exactly as the run's guard does. Writes ``<run>/context_check.json`` and prints a summary;
generates nothing. The run itself then clamps or rejects per ``job.context_policy``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import ray.data
from ray import serve

from jobs.pipeline import chain as pipeline
from jobs.config import RunConfig
from jobs.io.run_store import RunStore
from jobs.io.sources import PromptFiles
from jobs.io.storage import Location, write_json_atomic
from jobs.pipeline.stage_inputs import StageInputs
from jobs.pipeline.validate import validate_batch
from contract import context_budget


COUNT_INPUTS = StageInputs("count tokens", {
    "key": "the row's key, kept beside its count", "messages": "the prompt, JSON",
    "tools": "the prompt's tools, JSON or null"})


class CountTokens:
    """Async actor: one handle call per batch returns the batch's prompt token counts."""

    def __init__(self, app_name: str, deployment_name: str):
        self.handle = serve.get_deployment_handle(deployment_name, app_name=app_name)

    async def __call__(self, batch: pa.Table) -> pa.Table:
        COUNT_INPUTS.check(batch)
        prompts = [{"messages": json.loads(m), "tools": json.loads(t) if t else None}
                   for m, t in zip(batch.column("messages").to_pylist(),
                                   batch.column("tools").to_pylist())]
        counts = await self.handle.count_prompt_tokens.remote(prompts)
        return pa.table({"key": batch.column("key"), "prompt_tokens": counts})


def count(cfg: RunConfig, inputs: list[Location]) -> np.ndarray:
    ds = ray.data.read_datasource(PromptFiles(inputs, cfg.job.limit, cfg.job.batch_size,
                                              max_line_bytes=cfg.job.max_line_bytes),
                                  num_cpus=pipeline.LIGHT_CPU)
    ds = ds.map_batches(validate_batch, batch_format="pyarrow", batch_size=None,
                        num_cpus=pipeline.LIGHT_CPU)
    ds = ds.filter(lambda row: row["reject_reason"] is None)
    ds = ds.map_batches(CountTokens, batch_format="pyarrow", batch_size=cfg.job.batch_size,
                        fn_constructor_args=(cfg.serve.app_name, cfg.serve.deployment_name),
                        compute=pipeline.actor_pool(1, cfg.job.max_actors), num_cpus=pipeline.LIGHT_CPU,
                        max_concurrency=cfg.job.max_batches_per_actor)
    return np.array(ds.select_columns(["prompt_tokens"]).to_pandas()["prompt_tokens"])


def summarize(tokens: np.ndarray, context_length: int, budget: int,
              reserved: int = 0) -> dict[str, Any]:
    room = np.array([context_budget.room(context_length, int(n), reserved) for n in tokens],
                    dtype=np.int64)
    needed = max(reserved, context_budget.SCHEDULER_CLAMP_MARGIN)  # beyond prompt + budget
    return {
        "prompts": int(len(tokens)), "context_length": context_length,
        "max_new_tokens": budget, "reserved_tokens": reserved,
        "prompt_tokens_max": int(tokens.max()) if len(tokens) else 0,
        "prompt_tokens_p99": float(np.percentile(tokens, 99)) if len(tokens) else 0.0,
        "short_of_full_budget": int((room < budget).sum()),
        "prompt_alone_too_long": int((room <= 0).sum()),
        "context_needed_for_all": (int(tokens.max() + budget + needed) if len(tokens)
                                   else budget + needed),
    }


def check_context(cfg: RunConfig, store: RunStore, inputs: list[Location],
                  context_length: int) -> dict[str, Any]:
    report = summarize(count(cfg, inputs), context_length, cfg.job.max_new_tokens,
                       cfg.engine.reserved_tokens)
    report["policy"] = cfg.job.context_policy
    write_json_atomic(store.loc("context_check.json"), report)
    return report


def describe(report: dict[str, Any]) -> str:
    short = report["short_of_full_budget"]
    lines = [f"context check: {report['prompts']} prompts, context_length "
             f"{report['context_length']}, budget {report['max_new_tokens']}",
             f"  longest prompt {report['prompt_tokens_max']} tokens "
             f"(p99 {report['prompt_tokens_p99']:.0f}); "
             f"context for all at full budget: {report['context_needed_for_all']}",
             f"  {short} prompts cannot get their full budget "
             f"({report['prompt_alone_too_long']} do not fit at all); job.context_policy="
             f"{report['policy']} will {'clamp' if report['policy'] == 'clamp' else 'reject'}"
             f" them"]
    return "\n".join(lines)
