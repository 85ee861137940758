"""A session's mode as one object: the :class:`Mode` enum and one small strategy per mode.

Each mode (fresh, retry-failed, pilot, continue, regenerate, next-turn) answers the
same questions once, here, instead of in a branch at every call site:

- the generate stage (jobs/pipeline/generate_stage.py): which columns its rows carry
  (``inputs``), how a row's request is built (``request``), how its result becomes a
  data/ row (``data_row``) and a permanent failure a row (``failed``), and whether the
  breaker judges the fleet by the rows' integrity flags (``judges_flags``);
- the session (jobs/runs/): where its rows come from (``source``, the plan
  jobs/runs/plans.py makes), whether a job.regenerate every_turn run refuses it
  (``every_turn_refusal``), what the summary calls its new versions (``versions_as``),
  and what follows it in jobs.generate (``then_rounds``, ``says_regenerated``).

Adding a mode is one strategy class here (plus a plan in jobs/runs/plans.py when its
rows come from somewhere new) and its tests: tests/unit/jobs/pipeline/test_modes.py.
job.regenerate every_turn is the run's setting, not a mode: the prompt strategies build
turn requests and rows when the stage says ``every_turn``.
"""

from __future__ import annotations

import enum
import json
from typing import TYPE_CHECKING, Any, Optional

from contract.protocol import GenerateRequest, GenerateResult
from jobs.io.samples import SEED_FIELD
from jobs.pipeline import turns
from jobs.pipeline.rows import continued_row, data_row, failure_row, stopped_row
from jobs.pipeline.stage_inputs import StageInputs

if TYPE_CHECKING:
    from jobs.pipeline.settings import StageSettings


class Mode(enum.StrEnum):
    """Which rows a session sends (chosen once, from the CLI flags: ``RunMode.of_flags``)."""

    FRESH = "fresh"
    RETRY_FAILED = "retry-failed"
    PILOT = "pilot"
    CONTINUE = "continue"
    REGENERATE = "regenerate"
    NEXT_TURN = "next-turn"


# Every session's rows carry these: its requests and its data and failure rows are made
# from them (jobs/pipeline/rows.py).
GENERATE_INPUTS = StageInputs("generate", {
    "key": "the request's and the row's key", "id": "the input id the row keeps",
    "category": "the metric label and the row's category",
    "messages": "the prompt, JSON", "tools": "the prompt's tools, JSON or null"})
# A continue session sends a data/ row's own ids and adds its counts up (rows.continued_row).
CONTINUE_INPUTS = {name: "the data/ row being continued" for name in (
    "version", "prompt_token_ids", "output_token_ids", "completion_tokens",
    "reasoning_tokens", "finished_thinking", "spec_verify_ct", "latency_s",
    "budget_history", "continuations")}
NEXT_VERSION_INPUTS = {"version": "the row written is its next version"}

# The error class of a failure whose row stays in data/ (a continuation or a turn round):
# the row is not lost, only its extension; the run index leaves such keys done.
HELD_PREFIX = "continuation:"


class Strategy:
    """A session of prompts from the input, written as version 0 (fresh). The other
    modes override only what they do differently."""

    mode = Mode.FRESH
    inputs: StageInputs = GENERATE_INPUTS
    judges_flags = True             # breaker: the fleet-wide integrity-flags verdict
    failure_prefix = ""             # HELD_PREFIX when the failed row stays in data/
    source = "input"                # the plan: input | truncated | condemned | open_turns
    every_turn_refusal: Optional[str] = None  # an every_turn run refuses it: what to say
    versions_as = "continued"       # the summary's word for this session's new versions
    then_rounds = True              # an every_turn run's rounds follow it (jobs.generate)
    says_regenerated = False        # its summary says what it regenerated

    def request(self, row: dict[str, Any], stage: "StageSettings",
                category: str) -> GenerateRequest:
        """The row's request: its prompt as messages (with job.regenerate every_turn, the
        conversation up to its next turn, on the model's own earlier turns)."""
        request = _base_request(row, stage, category)
        request.messages = json.loads(row["messages"])
        request.tools = json.loads(row["tools"]) if row["tools"] else None
        if stage.every_turn:
            earlier = row.get("turns") or []
            request.messages = turns.prompt_messages(request.messages, earlier)
            request.assistant_spans = bool(earlier)
        return request

    def data_row(self, row: dict[str, Any], result: GenerateResult, stage: "StageSettings",
                 attempts: int) -> dict[str, Any]:
        out = data_row(row, result, stage, attempts)
        out["version"] = self.version(row)
        if stage.every_turn:
            out = turns.with_turn(out, row.get("turns") or [], result,
                                  json.loads(row["messages"]))
        return out

    def version(self, row: dict[str, Any]) -> int:
        """The data row's version: 0, a new prompt's first."""
        return 0

    def failed(self, row: dict[str, Any], error_class: str, message: str, attempts: int,
               stage: "StageSettings", replica: Optional[str],
               retryable: bool) -> dict[str, Any]:
        """The row a permanent failure (or one out of attempts) writes: a failures/ row."""
        return failure_row(row, error_class, message, attempts, stage, replica,
                           prefix=self.failure_prefix)


class RetryFailed(Strategy):
    """Fresh, also sending the keys failures/ holds without a result."""

    mode = Mode.RETRY_FAILED


class Pilot(Strategy):
    """Fresh, on a sample stratified by category, as its own run (jobs/runs/pilot.py)."""

    mode = Mode.PILOT


class NewVersion(Strategy):
    """Rows data/ holds, sent again: each result is the row's next version."""

    inputs = GENERATE_INPUTS | NEXT_VERSION_INPUTS

    def version(self, row: dict[str, Any]) -> int:
        return row["version"] + 1


class Regenerate(NewVersion):
    """The rows drained replicas condemned (with --regenerate-flagged, flagged rows too),
    their prompts again (jobs/runs/regenerate.py). Chosen by their earlier output, so
    their flag rate says nothing about the fleet: no flags verdict."""

    mode = Mode.REGENERATE
    judges_flags = False
    source = "condemned"
    every_turn_refusal = "regenerating condemned or flagged rows"
    versions_as = "regenerated"
    then_rounds = False
    says_regenerated = True


class NextTurn(NewVersion):
    """A round of job.regenerate every_turn: the next turn of each open conversation
    (jobs/runs/turn_rounds.py). A permanent failure ends the conversation with the turns
    it has (rows.stopped_row); a retryable one out of attempts leaves it open."""

    mode = Mode.NEXT_TURN
    failure_prefix = HELD_PREFIX
    source = "open_turns"

    def failed(self, row, error_class, message, attempts, stage, replica, retryable):
        if not retryable:
            return stopped_row(row, error_class, attempts)
        return super().failed(row, error_class, message, attempts, stage, replica, retryable)


class Continue(Strategy):
    """--continue-truncated: the rows cut at their budget, extended token-exactly to
    ``stage.continue_to`` (prompt ids + output ids sent as ids; jobs/runs/continuation.py).
    Cut at the budget is where loops gather: no flags verdict."""

    mode = Mode.CONTINUE
    inputs = GENERATE_INPUTS | CONTINUE_INPUTS
    judges_flags = False
    failure_prefix = HELD_PREFIX
    source = "truncated"
    every_turn_refusal = "--continue-truncated"
    then_rounds = False

    def request(self, row, stage, category):
        request = _base_request(row, stage, category)
        prompt = list(row["prompt_token_ids"])
        request.input_ids = prompt + list(row["output_token_ids"])
        request.prompt_len = len(prompt)
        request.max_new_tokens = stage.continue_to - row["completion_tokens"]
        return request

    def data_row(self, row, result, stage, attempts):
        return continued_row(row, result, stage, attempts)


STRATEGIES: dict[Mode, Strategy] = {s.mode: s for s in (
    Strategy(), RetryFailed(), Pilot(), Continue(), Regenerate(), NextTurn())}


def strategy(mode: Mode | str) -> Strategy:
    """The one strategy of ``mode``."""
    return STRATEGIES[Mode(mode)]


def _base_request(row: dict[str, Any], stage: "StageSettings", category: str) -> GenerateRequest:
    """What every mode's request carries: key, run, the category label, the budget, the
    sampling (the row's setting's, jobs/pipeline/sampling_mix.py: with a mix the row's
    ``setting`` column names it; + the sample's seed with n > 1; a continued row's own)
    and context policy, and job.logprobs' top-N (None: none asked)."""
    sampling = stage.setting_of(row).sampling
    if row.get("seed") is not None:
        sampling = dict(sampling, **{SEED_FIELD: int(row["seed"])})
    return GenerateRequest(key=row["key"], run=stage.run, category=category,
                           max_new_tokens=stage.max_new_tokens, sampling=sampling,
                           context_policy=stage.context_policy, logprobs=stage.logprobs)
