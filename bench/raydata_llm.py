"""Mode (c): Ray's own ``ray.data.llm`` path against the same Serve deployment.

Ray 2.60's ``ServeDeploymentStage`` always calls the deployment through
``handle.options(stream=True)`` and awaits the first streamed item. Our
deployment's ``generate(request)`` is a unary async method, so Serve answers a
streaming call to it with ``TypeError: Called method 'generate' with
handle.options(stream=True) but it did not return a generator`` (after the engine
has already done the work). What it *can* drive is ``generate_many(requests)``, an
async generator: the processor's ``dtype`` hook builds the request object as
``dtype(**request_kwargs, request_id=..., idx_in_batch=...)``, and
``RaygenRequestList`` turns that into a one-element list holding the same request
GenerateRequest GenerateRows sends (messages/tools parsed from the prompt line). Each row is one
``generate_many([request])`` call whose single streamed result is that row's result.
"""

from __future__ import annotations

import json
import time
from typing import Any

from contract.protocol import GenerateRequest
from jobs.pipeline.settings import StageSettings


class RaygenRequestList(list):
    """dtype for ServeDeploymentProcessorConfig: kwargs -> [GenerateRequest]."""

    def __init__(self, *, prompt_json: str, max_new_tokens: int, sampling_json: str,
                 run: str, context_policy: str, **_stage_fields: Any):
        row = json.loads(prompt_json)
        super().__init__([GenerateRequest(
            key=row["id"], run=run, category=row.get("category") or "none",
            messages=row["messages"], tools=row.get("tools") or None,
            max_new_tokens=max_new_tokens, sampling=json.loads(sampling_json),
            context_policy=context_policy)])


def build_dataset(prompts_path: str, app_name: str, deployment_name: str,
                  stage: StageSettings, batch_size: int, actors: int):
    import ray.data
    from ray.data.llm import ServeDeploymentProcessorConfig, build_processor

    config = ServeDeploymentProcessorConfig(
        deployment_name=deployment_name, app_name=app_name,
        dtype_mapping={"RaygenRequestList": RaygenRequestList},
        batch_size=batch_size, concurrency=actors)
    fixed = {"max_new_tokens": stage.max_new_tokens, "sampling_json": stage.sampling_json,
             "run": stage.run, "context_policy": stage.context_policy}

    def preprocess(row: dict[str, Any]) -> dict[str, Any]:
        return {"method": "generate_many", "dtype": "RaygenRequestList",
                "request_kwargs": dict(fixed, prompt_json=row["text"])}

    def postprocess(row: dict[str, Any]) -> dict[str, Any]:
        return {"key": row["key"], "reasoning": row["reasoning"], "answer": row["answer"],
                "prompt_token_ids": row["prompt_token_ids"],
                "output_token_ids": row["output_token_ids"],
                "finish_reason": row["finish_reason"],
                "completion_tokens": row["completion_tokens"], "latency_s": row["latency_s"],
                "error_class": row["error_class"], "done_at": time.time()}

    processor = build_processor(config, preprocess=preprocess, postprocess=postprocess)
    return processor(ray.data.read_text(prompts_path))
