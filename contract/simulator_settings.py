"""Settings of one simulated engine.

Design decisions:
- One flat pydantic model (extra="forbid") so a typo in a knob is an error,
  not a silently ignored value.
- Units live in the field names (``_tok_s``, ``_s``) because these values
  cross process boundaries as bare numbers on a command line.
- The command-line form is derived from the model itself (one ``--kebab-case``
  flag per field), so adding a field needs no parser change. ``to_cli_args``
  emits every field, not only non-defaults: the launched process then runs
  with exactly the launcher's settings even if defaults change later.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Literal, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Fault knobs that POST /sim/faults may change at runtime; everything else is
# fixed for the life of the process (timing and the length model feed the
# determinism guarantees).
FAULT_FIELDS = ("error_rate", "error_status", "slow_rate", "slow_factor", "crash_after_requests",
                "broken_output")

_NONE_TOKEN = "none"


class SimulatorSettings(BaseModel):
    """Knobs of the simulated engine (timing, output lengths, faults)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    model_name: str = Field(
        "sim-qwen", min_length=1, description="Served model name: /server_info model_path and the metrics model_name label."
    )
    context_length: int = Field(32768, ge=16, description="Context window in tokens (input + output), as SGLang enforces it.")
    max_running_requests: int = Field(48, ge=1, description="Continuous-batching slots; further requests wait in a FIFO queue.")
    max_total_tokens: Optional[int] = Field(
        None, ge=16,
        description="KV pool in tokens (SGLang's --max-total-tokens): running requests hold their prompt and output tokens; "
        "admission reserves room for budgets as SGLang's scheduler does and decode retracts the newest request when "
        "the pool is full (scheduler.py). None = no pool: the slots alone bound the batch.",
    )
    schedule_conservativeness: float = Field(
        1.0, gt=0,
        description="SGLang's --schedule-conservativeness, with max_total_tokens: admission reserves 0.7 x this share "
        "(at most all) of every running request's budget left, decaying to 0.14 x that over 600 decode steps; "
        "below 1 admits more requests at once and retracts more when their outputs grow.",
    )
    per_request_decode_tok_s: float = Field(
        100.0, gt=0, description="Decode speed of one request running alone, simulated tokens per simulated second."
    )
    max_decode_tok_s: float = Field(
        3500.0, gt=0, description="Aggregate decode cap of the engine, simulated tokens per simulated second, shared by running requests."
    )
    prefill_tok_s: float = Field(20000.0, gt=0, description="Prefill speed, uncached prompt tokens per simulated second.")
    time_scale: float = Field(
        1.0,
        ge=0,
        description="Wall seconds per simulated second (0.01 = 100x faster); 0 = zero-latency mode: answer immediately.",
    )
    startup_s: float = Field(0.0, ge=0, description="Wall seconds after start during which /health answers 503.")
    accept_length: float = Field(
        3.0,
        ge=0,
        description="Mean speculative accept length (tokens per verify step); 0 or 1 = speculative decoding off, no spec fields.",
    )
    speculative_reserved_tokens: int = Field(
        0,
        ge=0,
        description="Tokens SGLang adds to the input length in its context check with EAGLE-family speculative "
        "decoding (compute_num_reserved_tokens: 4 for NEXTN 3/1/4).",
    )
    speculative_num_draft_tokens: int = Field(
        4, ge=2, description="--speculative-num-draft-tokens: spec_num_proposed_drafts = verify steps x (this - 1)."
    )
    speculative_algorithm: Literal["EAGLE", "EAGLE3", "STANDALONE", "DFLASH"] = Field(
        "EAGLE", description="The algorithm /server_info reports while speculative decoding is on, as SGLang resolves "
        "it (NEXTN arrives as EAGLE: contract/spec_resolution.py)."
    )
    speculative_num_steps: int = Field(3, ge=1, description="--speculative-num-steps as resolved, for /server_info.")
    speculative_eagle_topk: int = Field(1, ge=1, description="--speculative-eagle-topk as resolved, for /server_info.")
    length_median_tokens: float = Field(
        2270.0, gt=0, description="Median natural output length in tokens (lognormal, includes the EOS token)."
    )
    length_sigma: float = Field(0.645, ge=0, description="Lognormal sigma of the natural output length (in natural-log units).")
    length_prompt_coupling: float = Field(
        0.0,
        ge=0,
        description="How strongly longer prompts get longer outputs: log-length += coupling * log2(prompt_tokens/256), clipped to +-1.5.",
    )
    error_rate: float = Field(0.0, ge=0, le=1, description="Fraction of /generate requests answered with error_status.")
    error_status: int = Field(500, ge=400, le=599, description="HTTP status of injected errors.")
    slow_rate: float = Field(0.0, ge=0, le=1, description="Fraction of requests that decode slow_factor times slower.")
    slow_factor: float = Field(5.0, ge=1, description="Slowdown factor of slow requests.")
    crash_after_requests: int | None = Field(
        None,
        ge=1,
        description="When this many /generate requests have been received (counted from start or from the last "
        "/sim/faults update of this field) the process dies with os._exit(1), like a GPU fault; None = never.",
    )
    broken_output: Literal["", "empty", "token_loop", "drift"] = Field(
        "",
        description="Outputs broken the way engines have broken them while still reporting success: "
        "empty = EOS at once (no text, finish stop); token_loop = token id 0 repeated up to the budget "
        "(at most 200), then EOS; drift = the output ids in reverse order (sound-looking rows no flag "
        "catches, unlike the other engines' at temperature 0: what the canary is for). '' = sound outputs.",
    )
    seed: int = Field(0, description="Seed of the fault RNG (error_rate, slow_rate draws) only; outputs never depend on it.")
    enable_strict_thinking: bool = Field(
        False,
        description="SGLang's --enable-strict-thinking: a request may then set max_thinking_tokens (the think end "
        "is forced after that many reasoning tokens); without it such a request is a 400, as in SGLang.",
    )

    @model_validator(mode="after")
    def _finite(self) -> "SimulatorSettings":
        # NaN/inf slip through ge/le bounds in places and would poison the timing model.
        for name, value in self:
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value}")
        return self

    @property
    def speculative(self) -> bool:
        """Speculative decoding is on when the mean accept length exceeds one token."""
        return self.accept_length > 1.0

    def fault_settings(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in FAULT_FIELDS}

    # ---- command line -------------------------------------------------
    def to_cli_args(self) -> list[str]:
        """Every field as ``--flag value`` pairs; ``from_cli_args`` inverts it exactly."""
        args: list[str] = []
        for name in type(self).model_fields:
            value = getattr(self, name)
            args += [_flag(name), _NONE_TOKEN if value is None else repr(value) if isinstance(value, float) else str(value)]
        return args

    @classmethod
    def add_cli_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add one ``--kebab-case`` option per field; absent options keep the field default."""
        for name, field in cls.model_fields.items():
            parser.add_argument(
                _flag(name),
                dest=name,
                default=argparse.SUPPRESS,
                type=_cli_parser_for(field.annotation),
                help=f"{field.description} (default: {field.default})",
            )

    @classmethod
    def from_namespace(cls, namespace: argparse.Namespace) -> "SimulatorSettings":
        values = {name: getattr(namespace, name) for name in cls.model_fields if hasattr(namespace, name)}
        return cls(**values)

    @classmethod
    def from_cli_args(cls, args: Sequence[str]) -> "SimulatorSettings":
        """Parse flags produced by ``to_cli_args`` (or typed by hand) back into settings."""
        parser = argparse.ArgumentParser(add_help=False)
        cls.add_cli_arguments(parser)
        return cls.from_namespace(parser.parse_args(list(args)))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected True or False, got {text!r}")
    return word == "true"


def _parse_optional_int(text: str) -> int | None:
    return None if text.strip().lower() in (_NONE_TOKEN, "null", "") else int(text)


def _cli_parser_for(annotation: Any):
    """argparse type callable for a field annotation."""
    simple = {int: int, float: float, str: str, bool: _parse_bool}
    if annotation in simple:
        return simple[annotation]
    if annotation == (int | None):
        return _parse_optional_int
    if getattr(annotation, "__origin__", None) is Literal:  # pydantic checks the value
        return str
    raise TypeError(f"no command-line parser for {annotation!r}; extend _cli_parser_for")
