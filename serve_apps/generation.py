"""One prompt through one engine: render, tokenize, guard the context, generate, parse.

This is the replica's request logic without any Ray in it, so it is tested directly
against a real (simulated) engine process. Row-level failures come back as results
with ``error_class`` set; only a dead engine raises (EngineDead) so Serve restarts us.

Continuation (``prompt_len`` set): ``input_ids`` = prompt + earlier output, sent as ids
(never re-tokenized text), so a continued row equals one long run token for token. The
result then carries the whole output (ids and text); its counts (completion_tokens,
spec_verify_ct, latency_s) are of the new segment only, which the job adds up. An
earlier output past its think end is sent with ``require_reasoning`` false and no
thinking budget (SGLang would treat its answer as new thinking: with strict thinking it
masks EOS there and cuts it at the budget again); one still thinking gets the row's
thinking budget minus its earlier output, so the row thinks as long as one long run.

Thinking off (``sampling["thinking"]`` false, job.sampling.thinking): the prompt is
rendered with thinking disabled (the renderer's ``thinking=False``: the builtin
template's empty think block, a model template's enable_thinking=False), the request
sends ``require_reasoning`` false and no thinking budget (fresh or continued), and the
whole output is the answer (chat_format.no_thinking): no think end is expected.

Context guard: the budget must fit the room SGLang really gives (context_budget.room:
its speculative reserve, its scheduler's input limit and silent clamp). Policy ``clamp``
shrinks the budget and records ``budget_clamped_by="context_guard"``; ``reject``
fails the row as ``context_overflow``. A prompt SGLang would refuse is always
rejected as ``context_overflow`` (never sent, so never a bad_request). If the engine
still enforces a smaller budget than we asked, ``budget_clamped_by="engine"`` records it.

Logprobs (``request.logprobs``, job.logprobs): asked of the engine
(engine_client.generate_body) and returned for this request's own tokens; a continued
row's earlier ones are the job's, which appends these (jobs/pipeline/rows.py). An answer
without them (or not one per output token) fails the row as ``engine_malformed``.

Assistant spans (``request.assistant_spans``, job.regenerate every_turn): where each
assistant message of the prompt lies in its ids, for the export's loss mask. The
renderer's character spans (chat_format.assistant_spans / probed_assistant_spans) become
token positions by tokenizing the text before each boundary: the position is the length
of the ids that prefix shares with the prompt's own (the prompt is tokenized whole, as
always, so the ids sent do not depend on the spans).
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from contract import context_budget
from contract.outcomes import (ContextOverflow, EngineAborted, EngineDead, EngineError,
                               EngineMalformed)
from contract.protocol import GenerateRequest, GenerateResult
from serve_apps.chat_format import assistant_spans, no_thinking, render_prompt, split_reasoning
from serve_apps.engine_client import (NAN_STOP, THINKING_BUDGET, EngineClient, EngineOutput,
                                     MalformedLogprobs, thinks)

# Leave room for at least this many new tokens or reject: a 1-token "completion" is
# worse than an explicit reject.
MIN_USEFUL_BUDGET = 16


class Generator:
    def __init__(self, client: EngineClient, context_length: int, think_end: str,
                 replica_id: str, engine_alive: Callable[[], bool],
                 render: Callable[..., str] = render_prompt, reserved_tokens: int = 0,
                 spans: Callable[..., list[tuple[int, int]]] = assistant_spans):
        self.client = client
        self.context_length = context_length
        self.reserved_tokens = reserved_tokens  # SGLang's speculative reserve (see context_budget)
        self.think_end = think_end
        self.replica_id = replica_id
        self._engine_alive = engine_alive
        self._render = render
        self._spans = spans  # the renderer's assistant spans (chat_format)
        self._think_end_ids: Optional[list[int]] = None  # tokenized once, for the fallback

    async def prompt_ids(self, request: GenerateRequest) -> list[int]:
        if request.input_ids:
            return list(request.input_ids)
        return await self.chat_ids(request.messages, request.tools,
                                   thinks(request.sampling or {}))

    async def chat_ids(self, messages: list[dict], tools: Optional[list[dict]],
                       thinking: bool = True) -> list[int]:
        """A chat prompt's ids, template applied (thinking on or off)."""
        return await self.client.tokenize(self._render(messages, tools, thinking=thinking))

    def fit_budget(self, prompt_len: int, budget: int, policy: str) -> int:
        room = context_budget.room(self.context_length, prompt_len, self.reserved_tokens)
        if room >= budget:
            return budget
        if policy == "clamp" and room >= MIN_USEFUL_BUDGET:
            return room
        raise ContextOverflow(
            f"prompt has {prompt_len} tokens and asks for {budget} new tokens, but "
            f"context_length {self.context_length} leaves room for {max(room, 0)} in SGLang "
            f"(speculative reserve {self.reserved_tokens}, scheduler margin "
            f"{context_budget.SCHEDULER_CLAMP_MARGIN}). Raise engine.context_length, lower "
            f"job.max_new_tokens, or use job.context_policy=clamp.")

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        key = request.key
        started = time.perf_counter()
        try:
            ids = await self.prompt_ids(request)
            budget = int(request.max_new_tokens)
            effective = self.fit_budget(len(ids), budget, request.context_policy)
            sampling, thinking = await self._continued_sampling(
                request, ids, dict(request.sampling or {}, max_new_tokens=effective))
            try:
                out = await self.client.generate(ids, sampling, rid=f"{key}-{time.time_ns()}",
                                                 require_reasoning=thinking,
                                                 logprobs=request.logprobs)
            except MalformedLogprobs as exc:
                raise EngineMalformed(f"row {key!r}: job.logprobs asked for logprobs "
                                      f"(top {request.logprobs}), the engine's answer: "
                                      f"{exc}") from exc
            check_finish(out)
            prompt_len = request.prompt_len
            if prompt_len is None:
                prompt_ids, output_ids, text = ids, out.output_ids, out.text
            else:  # continuation: ids = prompt + earlier output; decode the whole output
                prompt_ids, output_ids = ids[:prompt_len], ids[prompt_len:] + out.output_ids
                text = await self.client.detokenize(output_ids)
            if out.reasoning_tokens is None and self._think_end_ids is None:
                self._think_end_ids = await self.client.tokenize(self.think_end)
            spans = (await self.token_spans(request, ids)
                     if request.assistant_spans and request.messages else None)
        except EngineError as exc:
            if exc.retryable and not self._engine_alive():
                raise EngineDead(f"engine process exited: {exc}") from exc
            return GenerateResult.failed(key, exc.error_class, str(exc), self.replica_id)
        result = self._result(key, prompt_ids, output_ids, out, budget, effective,
                              time.perf_counter() - started, text,
                              thinks(request.sampling or {}))
        result.assistant_spans = spans
        if out.logprobs is not None:  # this request's tokens only (a continuation's too)
            result.output_logprobs = out.logprobs.sampled
            result.output_top_logprob_ids = out.logprobs.top_ids
            result.output_top_logprobs = out.logprobs.top_logprobs
        return result

    async def token_spans(self, request: GenerateRequest, ids: list[int]) -> list[list[int]]:
        """[start, end) in ``ids`` of each assistant message of the request's prompt."""
        # The spans lie before the generation prompt, the only part thinking changes.
        text = self._render(request.messages, request.tools,
                            thinking=thinks(request.sampling or {}))
        positions: dict[int, int] = {}
        out = []
        for span in self._spans(request.messages, request.tools):
            for at in span:
                if at not in positions:
                    prefix = await self.client.tokenize(text[:at]) if at else []
                    positions[at] = _shared(prefix, ids)
            out.append([positions[span[0]], max(positions[span[1]], positions[span[0]])])
        return out

    async def _continued_sampling(self, request: GenerateRequest, ids: list[int],
                                  sampling: dict) -> tuple[dict, bool]:
        """(sampling, still thinking) of this request: see the module docstring. A row
        rendered with thinking off never thinks: no budget, require_reasoning false."""
        if not thinks(sampling):
            sampling.pop(THINKING_BUDGET, None)
            return sampling, False
        if request.prompt_len is None:
            return sampling, True
        if self._think_end_ids is None:
            self._think_end_ids = await self.client.tokenize(self.think_end)
        earlier = ids[request.prompt_len:]
        if _contains(earlier, self._think_end_ids):
            sampling.pop(THINKING_BUDGET, None)
            return sampling, False
        if sampling.get(THINKING_BUDGET) is not None:
            sampling[THINKING_BUDGET] = max(0, sampling[THINKING_BUDGET] - len(earlier))
        return sampling, True

    def _result(self, key: str, ids: list[int], output_ids: list[int], out: EngineOutput,
                budget: int, effective: int, latency_s: float, text: str,
                thinking: bool = True) -> GenerateResult:
        reasoning, answer, finished_thinking = (split_reasoning(text, self.think_end)
                                                if thinking else no_thinking(text))
        clamped_by = "context_guard" if effective < budget else ""
        if out.finish_reason == "length" and out.finish_length and out.finish_length < effective:
            clamped_by = "engine"
        verify = out.spec_verify_ct
        return GenerateResult(
            key=key, text=text, reasoning=reasoning, answer=answer,
            finished_thinking=finished_thinking,
            prompt_token_ids=ids, output_token_ids=output_ids,
            finish_reason=out.finish_reason, matched_stop=out.matched_stop,
            prompt_tokens=len(ids), completion_tokens=out.completion_tokens,
            cached_tokens=out.cached_tokens,
            reasoning_tokens=(_reasoning_tokens(out, finished_thinking, self._think_end_ids)
                              if thinking else 0),
            spec_verify_ct=verify,
            accept_length=(out.completion_tokens / verify) if verify else None,
            latency_s=latency_s, replica=self.replica_id,
            max_new_tokens=budget, effective_max_new_tokens=effective,
            budget_clamped_by=clamped_by)




def check_finish(out: EngineOutput) -> None:
    """A 200 that is not a completion: aborted or NaN. Retryable, never a data row."""
    if out.finish_reason == "abort":
        raise EngineAborted(f"engine aborted the request after {out.completion_tokens} tokens")
    if out.finish_reason == "stop" and out.matched_stop == NAN_STOP:
        raise EngineAborted("engine produced NaN logits (finish matched 'NaN happened')")


def _shared(a: list[int], b: list[int]) -> int:
    """How many leading ids a and b share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _contains(ids: list[int], part: list[int]) -> bool:
    n = len(part)
    return n > 0 and any(ids[i:i + n] == part for i in range(len(ids) - n + 1))


def _reasoning_tokens(out: EngineOutput, finished_thinking: bool,
                      think_end_ids: Optional[list[int]]) -> Optional[int]:
    """SGLang's count (sent require_reasoning); else the tokens through the first think end."""
    if out.reasoning_tokens is not None:
        return int(out.reasoning_tokens)
    ids, n = out.output_ids, len(think_end_ids or ())
    if n:
        for i in range(len(ids) - n + 1):
            if ids[i:i + n] == think_end_ids:
                return i + n
    # No think end in this segment: all of it was reasoning, unless thinking had ended
    # in an earlier segment of a continued row.
    return 0 if finished_thinking else out.completion_tokens
