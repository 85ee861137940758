"""What crosses the Serve boundary: one request in, one result out (plain dicts).

Plain dicts, not pydantic, because a 900K-row job sends ~1M of them through Ray and
(de)serialisation is per-row overhead. ``REQUEST_KEYS`` / ``RESULT_KEYS`` are the row
contract between jobs/ and serve_apps/; tests/unit/test_protocol.py keeps them in sync
with the output schema.
"""

from __future__ import annotations

from typing import Any

# key: stable row key; run/category: metric labels; messages/tools: the chat prompt;
# input_ids: token-exact continuation input (prompt + earlier output) instead of messages;
# prompt_len: with input_ids, how many of them are the prompt (None for a first try);
# max_new_tokens: the budget; sampling: validated SGLang sampling params;
# context_policy: "clamp" (shrink the budget to fit, recorded) or "reject".
REQUEST_KEYS = ("key", "run", "category", "messages", "tools", "input_ids", "prompt_len",
                "max_new_tokens", "sampling", "context_policy")

RESULT_KEYS = (
    "key", "text", "reasoning", "answer", "finished_thinking",
    "prompt_token_ids", "output_token_ids", "finish_reason", "matched_stop",
    "prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens",
    "spec_verify_ct", "accept_length", "latency_s", "replica",
    "max_new_tokens", "effective_max_new_tokens", "budget_clamped_by",
    "error_class", "error_message", "retryable",
)


def error_result(key: str, error_class: str, message: str, retryable: bool,
                 replica: str = "") -> dict[str, Any]:
    """A failed row as data: the same keys as a success, error fields set."""
    result: dict[str, Any] = {k: None for k in RESULT_KEYS}
    result.update(key=key, error_class=error_class, error_message=message[:2000],
                  retryable=retryable, replica=replica)
    return result
