"""SGLang's native /generate request contract: parsing, validation, error bodies.

Design decisions:
- Validation is strict where real SGLang is strict (unknown sampling keys,
  context length, value ranges, with SGLang's wording) so client bugs show up
  on CPU, not first on a GPU cluster. Sampling knobs that only change *which*
  tokens a real model samples (temperature, top_p, penalties, json_schema...)
  are validated and then ignored: the simulated output is deterministic. The one
  exception is ``sampling_seed``: another seed draws another output (model.py), as
  independent samples of a real model differ; the same seed, the same output.
- Only one prompt per request and no streaming: raygen never batches in one
  HTTP call nor streams; rejecting loudly beats half-supporting.
- Input ids may lie outside the toy vocabulary (ids from a real tokenizer);
  the model only hashes them. They must be ints in [0, 2**31).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

from serve_apps.engines.simulator import tokenizer as tk

# sglang/api/v1 contract (GenerateSamplingParams), in its order: the unknown-field message lists them so.
SAMPLING_CONTRACT_KEYS = (
    "max_new_tokens stop stop_token_ids stop_regex temperature top_p top_k min_p frequency_penalty "
    "presence_penalty repetition_penalty min_new_tokens n json_schema regex ebnf structural_tag ignore_eos "
    "skip_special_tokens spaces_between_special_tokens no_stop_trim stream_interval logit_bias sampling_seed "
    "custom_params beam_width watermark choice"
).split()
ALLOWED_SAMPLING_KEYS = frozenset(SAMPLING_CONTRACT_KEYS)
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's SamplingParams default
MAX_TOKEN_ID = 2**31


class RequestError(Exception):
    """A request the engine refuses; becomes an SGLang-shaped error body."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class ContractError(RequestError):
    """The body breaks SGLang's typed /generate contract (sglang/api/v1): a plain-string error body."""


def error_body(message: str, status: int) -> dict[str, Any]:
    """http_server._create_error_response: ``{"error": {"message": ...}}``."""
    return {"error": {"message": message}}


def contract_error_body(message: str) -> dict[str, Any]:
    """http_server.generate_request on a contract error: ``{"error": "<message>"}``."""
    return {"error": message}


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    input_ids: list[int]
    rid: str
    max_new_tokens: int | None  # None: absent, SGLang default applies after the context check
    min_new_tokens: int
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    skip_special_tokens: bool
    no_stop_trim: bool
    require_reasoning: bool = False
    max_thinking_tokens: int | None = None  # request field; needs strict thinking (server.py)
    sampling_seed: int | None = None  # sampling_params.sampling_seed: another seed, another output
    return_logprob: bool = False  # output tokens' logprobs in meta_info (model.logprobs)
    top_logprobs_num: int = 0  # with return_logprob: the top N per output token


def parse_generate(body: Any) -> GenerateRequest:
    if not isinstance(body, dict):
        raise RequestError("The request body must be a JSON object.")
    input_ids = _parse_input(body)
    if body.get("stream"):
        raise RequestError("stream is not supported by the simulator")
    sp = body.get("sampling_params") or {}
    if isinstance(sp, list):
        raise RequestError("the simulator accepts one prompt per request")
    if not isinstance(sp, dict):
        raise RequestError("sampling_params must be a JSON object.")
    unknown = [k for k in sp if k not in ALLOWED_SAMPLING_KEYS]  # the first one, as serde reports it
    if unknown:
        expected = ", ".join(f"`{k}`" for k in SAMPLING_CONTRACT_KEYS)
        raise ContractError(f"unknown field `{unknown[0]}`, expected one of {expected}")
    _verify_ranges(sp)
    rid = body.get("rid")
    if isinstance(rid, list):
        raise RequestError("the simulator accepts one prompt per request")
    if rid is not None and not isinstance(rid, str):
        raise RequestError("rid must be a string.")
    return GenerateRequest(
        input_ids=input_ids,
        rid=rid or uuid.uuid4().hex,
        max_new_tokens=_opt_int(sp, "max_new_tokens"),
        min_new_tokens=_opt_int(sp, "min_new_tokens") or 0,
        stop=_parse_stop(sp.get("stop")),
        stop_token_ids=tuple(_int_list(sp.get("stop_token_ids") or [], "stop_token_ids")),
        ignore_eos=_opt_bool(sp, "ignore_eos", False),
        skip_special_tokens=_opt_bool(sp, "skip_special_tokens", True),
        no_stop_trim=_opt_bool(sp, "no_stop_trim", False),
        require_reasoning=_opt_bool(body, "require_reasoning", False),
        max_thinking_tokens=_typed_int(body, "max_thinking_tokens", "u64"),
        sampling_seed=sp.get("sampling_seed"),
        return_logprob=_opt_bool(body, "return_logprob", False),
        top_logprobs_num=_top_logprobs_num(body),
    )


def _top_logprobs_num(body: dict) -> int:
    """SGLang's top_logprobs_num (i64; default 0). ``logprob_start_len`` is checked like
    SGLang's scheduler (not above the input's length) and otherwise ignored: the
    simulator computes no input logprobs."""
    n = _typed_int(body, "top_logprobs_num", "i64") or 0
    if n < 0:
        raise RequestError(f"top_logprobs_num must be >= 0, got {n}.")
    start = _typed_int(body, "logprob_start_len", "i64")
    if body.get("return_logprob") and start is not None and start > len(body.get("input_ids") or []):
        raise RequestError(f"req.logprob_start_len={start} is higher than the number of input tokens "
                           f"len(req.origin_input_ids)={len(body['input_ids'])}. Please use a smaller logprob_start_len.")
    return n


STRICT_THINKING_NEEDED = "max_thinking_tokens requires the server to be launched with --enable-strict-thinking"


def _serde_unexpected(v: Any) -> str:
    """serde's ``Unexpected`` text, as sglang/api/v1/api_types._unexpected writes it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v}"'
    return {list: "sequence", dict: "map"}.get(type(v), type(v).__name__)


def _typed_int(body: dict, key: str, kind: str) -> int | None:
    """A top-level ``kind`` ("i64" or "u64") field of SGLang's typed contract
    (api_types._expect_uint for u64)."""
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ContractError(f"invalid type: {_serde_unexpected(v)}, expected {kind}")
    if kind == "u64" and v < 0:
        raise ContractError(f"invalid value: integer `{v}`, expected u64")
    return v


def _parse_input(body: dict) -> list[int]:
    has_text, has_ids = body.get("text") is not None, body.get("input_ids") is not None
    if has_text == has_ids:
        raise RequestError("Either text or input_ids should be provided, not both and not neither.")
    if has_text:
        text = body["text"]
        if isinstance(text, list):
            raise RequestError("the simulator accepts one prompt per request")
        if not isinstance(text, str):
            raise RequestError("text must be a string.")
        ids = tk.encode(text)
    else:
        raw = body["input_ids"]
        if isinstance(raw, list) and raw and isinstance(raw[0], list):
            raise RequestError("the simulator accepts one prompt per request")
        ids = _int_list(raw, "input_ids")
        if any(not 0 <= t < MAX_TOKEN_ID for t in ids):
            raise RequestError(f"input_ids must lie in [0, {MAX_TOKEN_ID}).")
    if not ids:
        raise RequestError("The input is empty.")
    return ids


# Scheduler limits (scheduler.py / tp_worker.py): max_req_len = context - 1,
# max_req_input_len = max_req_len - 5, and init_req_max_new_tokens clamps to max_req_len - input - 1.
SCHEDULER_INPUT_MARGIN = 6
SCHEDULER_CLAMP_MARGIN = 2


def check_context(n_input: int, req: GenerateRequest, context_length: int, reserved_tokens: int = 0) -> int:
    """SGLang's three context checks, in its order and wording; returns the max_new_tokens it enforces.

    1. tokenizer_manager._validate_one_request (input counted with the speculative reserve);
    2. managers/utils.validate_input_length in the scheduler;
    3. Scheduler.init_req_max_new_tokens: the silent clamp.
    """
    counted = n_input + reserved_tokens
    if counted >= context_length:
        raise RequestError(f"The input ({counted} tokens) is longer than the model's context length ({context_length} tokens).")
    if req.max_new_tokens is not None and req.max_new_tokens + counted > context_length:
        total = counted + req.max_new_tokens
        raise RequestError(
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
            f"You requested a total of {total} tokens: {counted} tokens from the input messages and "
            f"{req.max_new_tokens} tokens for the completion. Please reduce the number of tokens in the input "
            "messages or the completion to fit within the limit."
        )
    max_input = context_length - SCHEDULER_INPUT_MARGIN
    if n_input >= max_input:
        raise RequestError(
            f"Input length ({n_input} tokens) exceeds the maximum allowed length ({max_input} tokens). "
            "Use a shorter input or enable --allow-auto-truncate."
        )
    wanted = DEFAULT_MAX_NEW_TOKENS if req.max_new_tokens is None else req.max_new_tokens
    return max(0, min(wanted, context_length - n_input - SCHEDULER_CLAMP_MARGIN))


def _verify_ranges(sp: dict) -> None:
    """SGLang's SamplingParams.verify checks, same messages."""
    # (key, ok, message): sampling/sampling_params.py SamplingParams.verify, in its order; the value
    # is quoted as the JSON had it (-1 stays "-1", -1.0 stays "-1.0"), as SGLang's HTTP path does.
    checks = (
        ("temperature", lambda v: math.isfinite(v) and v >= 0, "temperature must be a non-negative finite number, got {}."),
        ("top_p", lambda v: 0 < v <= 1, "top_p must be in (0, 1], got {}."),
        ("min_p", lambda v: 0 <= v <= 1, "min_p must be in [0, 1], got {}."),
        ("top_k", lambda v: v == -1 or v >= 1, "top_k must be -1 (disable) or at least 1, got {}."),
        ("frequency_penalty", lambda v: -2 <= v <= 2, "frequency_penalty must be in [-2, 2], got {}."),
        ("presence_penalty", lambda v: -2 <= v <= 2, "presence_penalty must be in [-2, 2], got {}."),
        ("repetition_penalty", lambda v: 0 < v <= 2, "repetition_penalty must be in (0, 2] (1.0 = no penalty), got {}."),
        ("min_new_tokens", lambda v: v >= 0, "min_new_tokens must be in [0, max_new_tokens], got {}."),
        ("max_new_tokens", lambda v: v >= 0, "max_new_tokens must be at least 0, got {}."),
    )
    greedy = isinstance(sp.get("temperature"), (int, float)) and 0 <= sp["temperature"] < 1e-6
    for key, ok, msg in checks:
        v = sp.get(key)
        if v is None or (key == "top_k" and greedy):
            # SamplingParams.__post_init__: temperature below 1e-6 means greedy, so SGLang
            # sets top_k = 1 before verify() (any top_k passes).
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RequestError(f"{key} must be a number, got {v!r}.")
        if not ok(v):
            raise RequestError(msg.format(v))
    seed = sp.get("sampling_seed")  # the typed contract's i64, then SamplingParams.verify
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ContractError(f"invalid type: {_serde_unexpected(seed)}, expected i64")
        if not -(2**63) <= seed <= 2**63 - 1:
            raise RequestError(f"sampling_seed must be in [-2**63, 2**63 - 1], got {seed}.")
    mx, mn = sp.get("max_new_tokens"), sp.get("min_new_tokens")
    if mx is not None and mn is not None and mn > mx:
        raise RequestError(f"min_new_tokens must be in [0, max_new_tokens({mx})], got {mn}.")
    n = sp.get("n")
    if n is not None and n != 1:
        raise RequestError(f"the simulator supports n=1 only, got n={n!r}.")


def _opt_int(sp: dict, key: str) -> int | None:
    v = sp.get(key)
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if not isinstance(v, int):
        raise RequestError(f"{key} must be an integer, got {v!r}.")
    return v


def _opt_bool(sp: dict, key: str, default: bool) -> bool:
    v = sp.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise RequestError(f"{key} must be a boolean, got {v!r}.")
    return v


def _int_list(v: Any, key: str) -> list[int]:
    if not isinstance(v, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in v):
        raise RequestError(f"{key} must be a list of integers.")
    return v


def _parse_stop(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or any(not isinstance(s, str) or not s for s in stops):
        raise RequestError("stop must be a non-empty string or a list of non-empty strings.")
    return tuple(stops)
