"""How many new tokens SGLang 0.5.23 really lets a prompt have, in one place.

SGLang checks a request three times (tests/contract/sglang/test_sglang_oracle.py calls
each of these SGLang functions and compares):

1. TokenizerManager._validate_one_request: input + reserved >= context -> 400, and
   input + reserved + max_new_tokens > context -> 400. ``reserved`` is
   compute_num_reserved_tokens(): with EAGLE-family speculative decoding (NEXTN is
   EAGLE) the draft tokens sit in the output slots. It reads the speculative settings
   as SGLang resolved them, not as configured (contract/spec_resolution.py).
2. validate_input_length in the scheduler: input >= context - 6 -> 400 (max_req_len is
   context - 1, max_req_input_len is max_req_len - 5).
3. Scheduler.init_req_max_new_tokens: max_new_tokens silently clamped to
   max_req_len - input - 1 = context - input - 2.

So the budget that is both accepted and honoured is context - input - max(reserved, 2),
and only while input < context - 6.
"""

from __future__ import annotations

# max_req_len = context - 1; max_req_input_len = max_req_len - 5 (scheduler.py, tp_worker.py).
SCHEDULER_INPUT_MARGIN = 6
# init_req_max_new_tokens: max_req_len - input - 1.
SCHEDULER_CLAMP_MARGIN = 2


def max_input_tokens(context_length: int, reserved: int) -> int:
    """The longest prompt SGLang accepts at all (both checks pass)."""
    return min(context_length - SCHEDULER_INPUT_MARGIN, context_length - reserved) - 1


def room(context_length: int, input_tokens: int, reserved: int) -> int:
    """New tokens SGLang both accepts and generates for this prompt (<= 0: none)."""
    if input_tokens > max_input_tokens(context_length, reserved):
        return 0
    return context_length - input_tokens - max(reserved, SCHEDULER_CLAMP_MARGIN)
