"""SGLang 0.5.23's real engine on this CPU (``engine.device: cpu``), for the tests of
what only SGLang decides: the engine section they run, and what the scripted model
(serve_apps/engines/sglang_cpu/models.py) must produce.
"""

from __future__ import annotations

from typing import Any

from serve_apps.chat_format import render_prompt
from serve_apps.engines.sglang_cpu import models
from serve_apps.engines.simulator import tokenizer as tk

CONTEXT = 256              # small, so every context boundary is cheap to reach
APP = "raygen-sglang"      # the Serve app of the shared pool (tests/integration/sglang/)
SERVED_NAME = "tiny-scripted"

# A chat prompt ends in "<think>\n": the scripted model thinks a..z, closes, answers A..J.
REASONING = "abcdefghijklmnopqrstuvwxyz"
ANSWER = "ABCDEFGHIJ"
TEXT = f"{REASONING}</think>{ANSWER}"
OUTPUT_IDS = ([models.byte_id(c) for c in REASONING] + [tk.THINK_END_ID]
              + [models.byte_id(c) for c in ANSWER] + [tk.EOS_ID])
REASONING_TOKENS = len(REASONING) + 1  # SGLang counts the </think> as reasoning


def engine_section(model_path: str, **overrides: Any) -> dict[str, Any]:
    """The engine section of the shared pool: the scripted model on SGLang's CPU engine,
    with strict thinking (so a run may set job.sampling.max_thinking_tokens; the scripted
    model never ends while thinking, so EOS masked there changes none of its outputs)."""
    return {"kind": "sglang", "device": "cpu", "model_path": model_path,
            "served_model_name": SERVED_NAME, "chat_template": "builtin",
            "reasoning_parser": "qwen3", "context_length": CONTEXT,
            "max_total_tokens": 16384, "max_running_requests": 16,
            "start_timeout_s": 300, "request_timeout_s": 120,
            "extra_args": {"enable-strict-thinking": True}, **overrides}


def chat_ids(question: str) -> list[int]:
    """A one-turn prompt as raygen renders it (builtin ChatML, thinking on)."""
    return tk.encode(render_prompt([{"role": "user", "content": question}]))
