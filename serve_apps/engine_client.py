"""HTTP client for SGLang's native API, shared by SGLang and the simulator.

Errors become typed exceptions by status code and exception type (never by message
text): connection problems and 503 -> EngineUnavailable (retry), other 5xx ->
EngineServerError (retry, bounded), 408/429 -> EngineBusy (retry with backoff), other
4xx -> EngineBadRequest (record, do not retry).

Keep-alive: SGLang's uvicorn closes idle connections after 5 s
(SGLANG_TIMEOUT_KEEP_ALIVE); the pool drops them after KEEPALIVE_S < 5 s, and a request
whose pooled connection the server closed anyway (ServerDisconnectedError: no byte of
a response) is sent once more on a new connection. aiohttp itself never retries a POST.

Every /generate sets ``require_reasoning``: SGLang counts ``reasoning_tokens`` only then
(otherwise it reports 0), and with ``--enable-strict-thinking`` it treats the output as
thinking until the think end (a thinking budget applies; EOS is masked). A continuation
whose output already left its thinking sends false (serve_apps/generation.py).

``max_thinking_tokens`` travels in raygen's sampling dict (it is recorded and hashed with
the sampling) but SGLang takes it as a request field: the body moves it there. So does
``thinking`` (false: the prompt was rendered with thinking off), which SGLang never sees:
such a request sends ``require_reasoning`` false (the whole output is the answer).

Logprobs (``logprobs`` N, job.logprobs): ``return_logprob`` with ``top_logprobs_num`` N and
``logprob_start_len`` = the input's length, so no input token's logprob is computed (in
0.5.23 that is also what -1 resolves to with return_logprob; older versions' -1 meant the
last prompt token); without N none of these fields is sent. SGLang answers
``output_token_logprobs`` as [logprob, token_id, text-or-null] per output token and, N >
0, ``output_top_logprobs`` as a list of such triples per token (``parse_logprobs``).

``parse_meta`` reads meta_info across SGLang versions: speculative fields were renamed
(0.5.5 ``spec_accept_length``; later ``spec_accept_rate``/``spec_num_correct_drafts``);
only ``spec_verify_ct`` is stable, so accept length is always completion_tokens /
spec_verify_ct, and aggregates are sum(tokens) / sum(verify), never a mean of ratios.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Union

import aiohttp

from contract.outcomes import EngineBadRequest, EngineBusy, EngineServerError, EngineUnavailable


@dataclass(frozen=True)
class EngineOutput:
    text: str
    output_ids: list[int]
    finish_reason: str            # "stop" | "length" | "abort"
    matched_stop: Optional[str]   # the stop string, or the stop token id as text
    finish_length: Optional[int]  # the budget SGLang says it enforced (length finishes)
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reasoning_tokens: Optional[int]
    spec_verify_ct: Optional[int]
    e2e_latency_s: Optional[float]
    spec_accept_rate: Optional[float] = None   # drafts accepted / drafts proposed (0.5.23)
    num_retractions: Optional[int] = None      # times SGLang evicted the request under KV pressure
    logprobs: Optional["Logprobs"] = None      # asked for (job.logprobs): parse_logprobs


@dataclass(frozen=True)
class Logprobs:
    """Per output token: the sampled token's logprob and the top N (ids, logprobs);
    top_ids/top_logprobs None when N = 0."""
    sampled: list[float]
    top_ids: Optional[list[list[int]]]
    top_logprobs: Optional[list[list[float]]]


class MalformedLogprobs(ValueError):
    """The body's logprobs are missing or do not match its output tokens."""


def _pair(entry: Any, what: str, masked_ok: bool = False) -> tuple[float, int]:
    """(logprob, token id) of one [logprob, token_id, text-or-null] entry. SGLang's JSON
    (orjson) sends -inf as null: a masked alternative (``masked_ok``) is stored as -inf;
    a sampled token cannot have been masked."""
    if not isinstance(entry, (list, tuple)) or len(entry) < 2:
        raise MalformedLogprobs(f"{what} is {entry!r}, not [logprob, token_id, text]")
    logprob, token = entry[0], entry[1]
    if isinstance(token, bool) or not isinstance(token, int):
        raise MalformedLogprobs(f"{what} has token id {token!r}")
    if logprob is None and masked_ok:
        return float("-inf"), token
    if isinstance(logprob, bool) or not isinstance(logprob, (int, float)):
        raise MalformedLogprobs(f"{what} has logprob {logprob!r}")
    return float(logprob), token


def parse_logprobs(body: dict[str, Any], top_k: int) -> Logprobs:
    """The output tokens' logprobs of a /generate body asked with ``logprobs`` top_k;
    raises MalformedLogprobs unless there is one entry per output id, each for that id,
    and (top_k > 0) top_k alternatives per token."""
    meta = body.get("meta_info") or {}
    output_ids = list(body.get("output_ids") or [])
    entries = meta.get("output_token_logprobs")
    if not isinstance(entries, list):
        raise MalformedLogprobs("meta_info has no output_token_logprobs list")
    if len(entries) != len(output_ids):
        raise MalformedLogprobs(f"{len(entries)} output_token_logprobs for "
                                f"{len(output_ids)} output tokens")
    sampled = []
    for i, (entry, token) in enumerate(zip(entries, output_ids)):
        logprob, got = _pair(entry, f"output_token_logprobs[{i}]")
        if got != token:
            raise MalformedLogprobs(f"output_token_logprobs[{i}] is for token {got}, the "
                                    f"output's is {token}")
        sampled.append(logprob)
    if top_k == 0:
        return Logprobs(sampled, None, None)
    tops = meta.get("output_top_logprobs")
    if not isinstance(tops, list) or len(tops) != len(output_ids):
        n = len(tops) if isinstance(tops, list) else "no"
        raise MalformedLogprobs(f"{n} output_top_logprobs for {len(output_ids)} output "
                                f"tokens (top_logprobs_num {top_k})")
    top_ids, top_logprobs = [], []
    for i, position in enumerate(tops):
        if not isinstance(position, list) or len(position) != top_k:
            raise MalformedLogprobs(f"output_top_logprobs[{i}] has "
                                    f"{len(position) if isinstance(position, list) else 'no'} "
                                    f"entries, not {top_k}")
        pairs = [_pair(e, f"output_top_logprobs[{i}][{j}]", masked_ok=True) for j, e in enumerate(position)]
        top_logprobs.append([p[0] for p in pairs])
        top_ids.append([p[1] for p in pairs])
    return Logprobs(sampled, top_ids, top_logprobs)


def parse_meta(body: dict[str, Any]) -> EngineOutput:
    """One /generate response body -> EngineOutput (any SGLang 0.5.5 .. 0.5.23 shape)."""
    meta = body.get("meta_info") or {}
    finish = meta.get("finish_reason") or {}
    if isinstance(finish, str):  # very old servers sent a bare string
        finish = {"type": finish}
    kind = finish.get("type") or "abort"
    matched = finish.get("matched")
    output_ids = list(body.get("output_ids") or [])
    completion = int(meta.get("completion_tokens", len(output_ids)))
    verify = meta.get("spec_verify_ct")
    return EngineOutput(
        text=body.get("text") or "",
        output_ids=output_ids,
        finish_reason=kind if kind in ("stop", "length", "abort") else "abort",
        matched_stop=None if matched is None else str(matched),
        finish_length=finish.get("length"),
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        completion_tokens=completion,
        cached_tokens=int(meta.get("cached_tokens") or 0),
        reasoning_tokens=meta.get("reasoning_tokens"),
        spec_verify_ct=int(verify) if verify else None,
        e2e_latency_s=meta.get("e2e_latency"),
        spec_accept_rate=meta.get("spec_accept_rate"),
        num_retractions=meta.get("num_retractions"),
    )


def effective_running_cap(server_info: dict[str, Any]) -> Optional[int]:
    """The running-request cap the scheduler really uses (it can be below the flag:
    memory, speculative decoding, mamba cache); None when the server does not say."""
    states = server_info.get("internal_states") or [{}]
    cap = (states[0] or {}).get("effective_max_running_requests_per_dp")
    if cap is None:
        cap = server_info.get("max_running_requests")
    return None if cap is None else int(cap)


def _error_message(status: int, payload: Union[dict, str]) -> str:
    if isinstance(payload, dict):
        msg = payload.get("message") or payload.get("error") or payload
        if isinstance(msg, dict):
            msg = msg.get("message", msg)
        return f"HTTP {status}: {msg}"
    return f"HTTP {status}: {str(payload)[:500]}"


# Below uvicorn's 5 s timeout_keep_alive, so the pool never reuses a connection the
# server is about to close.
KEEPALIVE_S = 4.0


# SGLang ends a request with stop/matched="NaN happened" when the logits went NaN.
NAN_STOP = "NaN happened"

THINKING_BUDGET = "max_thinking_tokens"
THINKING = "thinking"   # raygen's (job.sampling.thinking: false): how the prompt was rendered


def thinks(sampling: dict[str, Any]) -> bool:
    """Whether a request's sampling has thinking on (the default; false only when set)."""
    return sampling.get(THINKING, True) is not False


def generate_body(input_ids: list[int], sampling: dict[str, Any], rid: str,
                  require_reasoning: bool = True,
                  logprobs: Optional[int] = None) -> dict[str, Any]:
    """The /generate request raygen sends (see the module docstring)."""
    params = {k: v for k, v in sampling.items() if k not in (THINKING_BUDGET, THINKING)}
    body = {"input_ids": input_ids, "sampling_params": params, "rid": rid, "stream": False,
            "require_reasoning": require_reasoning}
    if sampling.get(THINKING_BUDGET) is not None:
        body[THINKING_BUDGET] = sampling[THINKING_BUDGET]
    if logprobs is not None:
        body.update(return_logprob=True, top_logprobs_num=logprobs,
                    logprob_start_len=len(input_ids))
    return body


class EngineClient:
    def __init__(self, base_url: str, request_timeout_s: float, max_connections: int = 1024):
        self.base_url = base_url
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._max_connections = max_connections
        self._session: Optional[aiohttp.ClientSession] = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=self._max_connections,
                                               keepalive_timeout=KEEPALIVE_S))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _send(self, method: str, path: str, json: Optional[dict]) -> tuple[int, Any]:
        async with self._get_session().request(method, self.base_url + path,
                                               json=json) as resp:
            if resp.content_type == "application/json":
                payload = await resp.json()
            else:
                payload = await resp.text()
            return resp.status, payload

    async def _request(self, method: str, path: str, json: Optional[dict] = None) -> Any:
        try:
            try:
                status, payload = await self._send(method, path, json)
            except aiohttp.ServerDisconnectedError:
                # The server closed the (pooled) connection before answering: the request
                # never ran to a response; once more on a fresh connection.
                status, payload = await self._send(method, path, json)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError,
                asyncio.TimeoutError) as exc:
            raise EngineUnavailable(f"{type(exc).__name__} calling {path}: {exc}") from exc
        if status == 200:
            return payload
        message = _error_message(status, payload)
        if status == 503:
            raise EngineUnavailable(message)
        if status in (408, 429):  # a 4xx that says "later", not "never"
            raise EngineBusy(message)
        if status >= 500:
            raise EngineServerError(message)
        raise EngineBadRequest(message)

    async def generate(self, input_ids: list[int], sampling: dict[str, Any],
                       rid: str, require_reasoning: bool = True,
                       logprobs: Optional[int] = None) -> EngineOutput:
        """``logprobs``: the top-N asked (None: none); a body without them raises
        MalformedLogprobs."""
        body = generate_body(input_ids, sampling, rid, require_reasoning, logprobs)
        answer = await self._request("POST", "/generate", json=body)
        out = parse_meta(answer)
        if logprobs is None or out.finish_reason == "abort" or out.matched_stop == NAN_STOP:
            return out  # not a completion (generation.check_finish): nothing to parse
        return dataclasses.replace(out, logprobs=parse_logprobs(answer, logprobs))

    async def tokenize(self, text: str) -> list[int]:
        payload = await self._request("POST", "/tokenize",
                                      json={"prompt": text, "add_special_tokens": False})
        return list(payload["tokens"])

    async def detokenize(self, ids: list[int]) -> str:
        payload = await self._request("POST", "/detokenize", json={"tokens": ids})
        return payload["text"]

    async def server_info(self) -> dict[str, Any]:
        return await self._request("GET", "/server_info")

    async def metrics_text(self) -> str:
        return await self._request("GET", "/metrics")

    async def healthy(self) -> bool:
        try:
            await self._request("GET", "/health")
            return True
        except (EngineUnavailable, EngineBusy, EngineServerError, EngineBadRequest):
            return False
