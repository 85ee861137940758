"""Continuous-batching timing model, in simulated time, driven by asyncio.

Design decisions:
- Event-driven fluid model instead of a fixed ticker: between events (an
  arrival, an admission, a completion) every running request progresses at a
  constant rate, so the driver sleeps exactly until the next completion or
  until an arrival wakes it. Idle cost is zero (no task exists when nothing
  runs) and the cost per event is O(running), fine for hundreds of requests.
- At most max_running_requests run; the rest wait in a FIFO queue. A running
  request first prefills its uncached prompt tokens (prompt/prefill_tok_s
  simulated seconds), then decodes at min(per_request, max_decode / n_running)
  tokens per simulated second (divided by its slow factor). Requests still in
  prefill occupy a slot and count in n_running, as a batch slot does.
- Wall time = simulated time * time_scale. time_scale == 0 completes requests
  immediately (zero-latency mode) but still counts tokens for /metrics.
- Completions within 0.1 ms wall of each other are retired together so float
  rounding cannot cause a storm of tiny sleeps.
- A cancelled waiter (client went away) is removed from the batch at once,
  freeing its share of the engine, like SGLang's abort on disconnect.
- Counters are plain ints/floats read by the /metrics collector at scrape time.
- KV pool (``max_total_tokens``; None: no pool, slots alone bound the batch): a running
  request holds its prompt and decoded tokens. As SGLang 0.5.23's scheduler does, a
  queued request is admitted (FCFS, stopping at the first that does not fit) only while
  held tokens + new_token_ratio x the budget left of every request admitted in an earlier
  pass + the whole budget left of every request admitted in this pass and of itself fit
  the pool (SGLang's PrefillAdder charges a candidate at its whole budget; an ignore_eos
  request stays reserved in full once running, so a batch of them alone never retracts;
  every budget is clipped at 4,096 tokens, SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION). A
  pass that stops on the pool admits nothing more until a request leaves the batch (it
  finishes, is cancelled or retracted: SGLang's batch_is_full). The ratio starts at 0.7
  and decays each decode step to 0.098 over 600 steps, so admission grows bolder as the
  batch runs. When decode runs out of room (a
  step needs a token per decoding request) the request with the fewest decoded tokens
  (then the longest prompt) is retracted: its tokens leave the pool, it goes back to the
  front of the queue keeping its output, and re-prefills prompt + output when admitted
  again; the ratio is reset to the running requests' decoded share (+20 steps each, at
  most 1). A lone running request is never retracted (SGLang would abort it).
  ``schedule_conservativeness`` (SGLang's --schedule-conservativeness) scales the ratio's
  start (0.7 x it, at most 1) and its floor alike; an idle engine starts again from the
  start, as SGLang's idle check resets it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional

RETIRE_SLACK_WALL_S = 1e-4
THROUGHPUT_WINDOW_S = 5.0  # wall seconds over which gen_throughput is averaged
SAMPLE_SPACING_S = 0.01  # at most one throughput sample per 10 ms keeps the deque small
SPEC_WINDOW_REQUESTS = 512
# SGLang 0.5.23's admission estimate (schedule_policy / scheduler): the share of a running
# request's remaining budget it reserves, from INIT down to INIT * MIN_FACTOR over
# DECAY_STEPS decode steps; RETRACT_STEPS: the steps each survivor is assumed to still need
# when the ratio is re-estimated after a retraction.
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096  # the most of a budget admission reserves room for


@dataclass(eq=False, slots=True)
class _Job:
    prompt_tokens: int  # all input tokens: occupy KV cache (token_usage)
    prefill_left_s: float  # simulated seconds of prefill still to do
    total_tokens: int  # completion tokens to decode
    slow_factor: float
    verify_steps: int  # speculative verify steps (0 when speculative is off)
    future: asyncio.Future = field(repr=False)
    decoded: float = 0.0
    reported: int = 0  # decoded tokens already added to the integer counter
    first_token_at: float | None = None  # wall (monotonic) time prefill ended: TTFT for /metrics
    on_prefilled: Callable[[], None] | None = field(default=None, repr=False)
    max_new: int = 0  # its budget: what admission reserves room for
    retractions: int = 0
    retracted_tokens: int = 0  # output decoded before its retractions (kept, re-prefilled)
    admitted_once: bool = False
    fixed_length: bool = False  # ignore_eos: it decodes its whole budget, reserved in full

    @property
    def held(self) -> float:
        """Tokens it holds in the KV pool while running."""
        return self.prompt_tokens + self.decoded

    def prefilled(self, at: float) -> None:
        self.first_token_at = at
        if self.on_prefilled is not None:
            self.on_prefilled()


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    running: int
    queued: int
    generation_tokens_total: int
    prompt_tokens_total: int
    requests_total: int
    gen_throughput_tok_s: float  # recent, per wall second
    spec_accept_length: float  # recent completed requests; 0 when none / speculative off
    token_usage: float  # running tokens / max_total_tokens (context_length * max_running_requests without a pool)
    capacity_tok_s: float  # max_decode_tok_s per wall second; 0 in zero-latency mode (infinite)
    idle_seconds_total: float  # wall s with nothing running or queued (SGLang's scheduler_idle_seconds)
    retractions_total: int = 0  # requests retracted since start
    last_retracted: int = 0  # requests the latest retraction took back (sglang:num_retracted_reqs)
    max_total_tokens: Optional[int] = None


class RunResult(NamedTuple):
    first_token_at: float  # wall (monotonic) time its prefill ended (the last one, if retracted)
    retractions: int       # times the pool took it back (meta_info num_retractions)


class Scheduler:
    def __init__(
        self,
        *,
        max_running_requests: int,
        per_request_decode_tok_s: float,
        max_decode_tok_s: float,
        prefill_tok_s: float,
        time_scale: float,
        context_length: int,
        max_total_tokens: Optional[int] = None,
        schedule_conservativeness: float = 1.0,
    ) -> None:
        self.max_running = max_running_requests
        self.max_total = max_total_tokens
        # SGLang 0.5.23's NewTokenRatioTracker.from_config
        self._ratio_init = min(INIT_NEW_TOKEN_RATIO * schedule_conservativeness, 1.0)
        self._ratio_floor = min(self._ratio_init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self._ratio = self._ratio_init
        self._pool_full = False  # SGLang's batch_is_full: no admission until a request leaves
        self.retractions_total = 0
        self.last_retracted = 0
        self.per_request_tok_s = per_request_decode_tok_s
        self.max_decode_tok_s = max_decode_tok_s
        self.prefill_tok_s = prefill_tok_s
        self.time_scale = time_scale
        self.context_length = context_length
        self._running: list[_Job] = []
        self._queue: deque[_Job] = deque()
        self._driver: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._last_t: float | None = None
        self._gen_cum = 0.0  # continuous decoded-token count, for throughput
        # Seeded at construction so a young process averages over its uptime, not since its first request.
        self._samples: deque[tuple[float, float]] = deque([(time.monotonic(), 0.0)])
        self._spec_recent: deque[tuple[int, int]] = deque(maxlen=SPEC_WINDOW_REQUESTS)
        self.generation_tokens_total = 0
        self._idle_s = 0.0  # closed idle spells
        self._idle_since: float | None = time.monotonic()  # None while there is work
        self.prompt_tokens_total = 0
        self.requests_total = 0

    # ---- public ---------------------------------------------------------
    async def run(
        self, prompt_tokens: int, compute_tokens: int, completion_tokens: int, *, slow_factor: float = 1.0, verify_steps: int = 0,
        on_prefilled: Callable[[], None] | None = None, max_new_tokens: Optional[int] = None,
        ignore_eos: bool = False,
    ) -> RunResult:
        """Wait (in wall time) until the request has been scheduled, prefilled and decoded.
        ``on_prefilled`` runs when its prefill ends (the server caches the prompt then, as
        SGLang's radix cache does); ``max_new_tokens``: its budget (admission reserves
        for it; default its completion)."""
        loop = asyncio.get_running_loop()
        if self.time_scale == 0:
            if on_prefilled is not None:
                on_prefilled()
            self._advance(time.monotonic())
            self.prompt_tokens_total += prompt_tokens
            self._gen_cum += completion_tokens
            self._record_sample(time.monotonic())
            self._complete_counts(completion_tokens, verify_steps)
            return RunResult(time.monotonic(), 0)
        job = _Job(prompt_tokens, compute_tokens / self.prefill_tok_s, completion_tokens, slow_factor, verify_steps,
                   loop.create_future(), on_prefilled=on_prefilled,
                   max_new=max(max_new_tokens or 0, completion_tokens), fixed_length=ignore_eos)
        self._advance(time.monotonic())
        self._busy(time.monotonic())
        self._queue.append(job)
        self._kick()
        try:
            await job.future
        except asyncio.CancelledError:
            self._drop(job)
            raise
        first = job.first_token_at if job.first_token_at is not None else time.monotonic()
        return RunResult(first, job.retractions)

    def stats(self) -> SchedulerStats:
        now = time.monotonic()
        self._advance(now)
        running_tokens = sum(j.held for j in self._running)
        pool = self.max_total or self.context_length * self.max_running
        spec_tokens = sum(t for t, _ in self._spec_recent)
        spec_steps = sum(v for _, v in self._spec_recent)
        return SchedulerStats(
            running=len(self._running),
            queued=len(self._queue),
            generation_tokens_total=self.generation_tokens_total,
            prompt_tokens_total=self.prompt_tokens_total,
            requests_total=self.requests_total,
            gen_throughput_tok_s=self._throughput(now),
            spec_accept_length=spec_tokens / spec_steps if spec_steps else 0.0,
            token_usage=running_tokens / pool,
            capacity_tok_s=self.max_decode_tok_s / self.time_scale if self.time_scale else 0.0,
            idle_seconds_total=self._idle_s + (now - self._idle_since if self._idle_since is not None else 0.0),
            retractions_total=self.retractions_total, last_retracted=self.last_retracted,
            max_total_tokens=self.max_total,
        )

    def _busy(self, now: float) -> None:
        if self._idle_since is not None:
            self._idle_s += now - self._idle_since
            self._idle_since = None

    # ---- driver ---------------------------------------------------------
    def _kick(self) -> None:
        if self._driver is None:
            self._driver = asyncio.get_running_loop().create_task(self._drive())
        else:
            self._wake.set()

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._running or self._queue:
                now = time.monotonic()
                self._advance(now)
                self._retire()
                self._retract()
                self._admit()
                delay = self._next_completion_wall_s()
                if delay is None:
                    continue  # everything retired/admitted; loop condition decides
                self._wake.clear()
                timer = loop.call_later(delay, self._wake.set)
                await self._wake.wait()
                timer.cancel()
        finally:
            self._driver = None
            if not self._running and not self._queue:
                self._idle_since = time.monotonic()
                self._ratio = self._ratio_init  # SGLang resets it when its batch empties
                self._pool_full = False

    def _rate(self) -> float:
        n = len(self._running)
        return min(self.per_request_tok_s, self.max_decode_tok_s / n) if n else self.per_request_tok_s

    def _advance(self, now: float) -> None:
        """Progress every running job from the last event to now at the current (constant) rates."""
        last, self._last_t = self._last_t, now
        if last is None or now <= last or not self._running:
            self._record_sample(now)
            return
        dt = (now - last) / self.time_scale
        rate = self._rate()
        if self.max_total is not None:  # one decode step per token a request decodes
            step = (self._ratio_init - self._ratio_floor) / NEW_TOKEN_RATIO_DECAY_STEPS
            self._ratio = max(self._ratio_floor, self._ratio - step * rate * dt)
        # with a pool a prefill's end is an event of its own: one within the retire slack
        # ends now (float rounding must not leave a remainder too small to wait for)
        slack = RETIRE_SLACK_WALL_S / self.time_scale if self.max_total is not None else 0.0
        growth: list[tuple[_Job, float]] = []
        for job in self._running:
            d = dt
            if job.prefill_left_s > 0:
                if d < job.prefill_left_s - slack or (not slack and d <= job.prefill_left_s):
                    job.prefill_left_s -= d
                    continue
                d = max(d - job.prefill_left_s, 0.0)
                job.prefilled(last + job.prefill_left_s * self.time_scale)
                job.prefill_left_s = 0.0
            growth.append((job, min(job.total_tokens - job.decoded, rate / job.slow_factor * d)))
        if self.max_total is not None and len(self._running) > 1:
            # Decode stops where the pool is full: a wake-up the event loop delayed (a
            # loaded machine) must not carry the batch past it; the retraction comes next
            # (a lone request is never retracted: it runs on, as before).
            room = max(self.max_total - sum(j.held for j in self._running), 0.0)
            total = sum(inc for _, inc in growth)
            if total > room:
                growth = [(job, inc * room / total) for job, inc in growth]
        for job, inc in growth:
            job.decoded += inc
            self._gen_cum += inc
            whole = int(job.decoded)
            if whole > job.reported:  # counter moves while decoding, like SGLang's per-batch stats
                self.generation_tokens_total += whole - job.reported
                job.reported = whole
        self._record_sample(now)

    def _remaining_wall_s(self, job: _Job, rate: float) -> float:
        return (job.prefill_left_s + (job.total_tokens - job.decoded) * job.slow_factor / rate) * self.time_scale

    def _retire(self) -> None:
        rate = self._rate()
        done = [j for j in self._running if self._remaining_wall_s(j, rate) <= RETIRE_SLACK_WALL_S]
        if not done:
            return
        done_ids = set(map(id, done))
        self._running = [j for j in self._running if id(j) not in done_ids]
        self._pool_full = False
        for job in done:
            self._gen_cum += job.total_tokens - job.decoded  # the sub-0.1 ms remainder
            self.generation_tokens_total -= job.reported
            self._complete_counts(job.total_tokens, job.verify_steps,
                                  spec_tokens=job.total_tokens + job.retracted_tokens)
            if not job.future.done():
                job.future.set_result(None)

    def _admit(self) -> None:
        if self._pool_full:
            return
        this_pass: set[int] = set()  # ids of the requests admitted now: charged whole
        while self._queue and len(self._running) < self.max_running:
            job = self._queue[0]
            if job.future.done():  # cancelled while queued
                self._queue.popleft()
                continue
            if self._running and not self._fits(job, this_pass):  # FCFS: the next waits
                self._pool_full = True
                break
            self._queue.popleft()
            this_pass.add(id(job))
            if not job.admitted_once:
                self.prompt_tokens_total += job.prompt_tokens
                job.admitted_once = True
            if job.prefill_left_s <= 0:  # fully cached prompt: decoding starts at admission
                job.prefilled(time.monotonic())
            self._running.append(job)

    # ---- the KV pool ----------------------------------------------------
    def _fits(self, job: _Job, this_pass: set[int]) -> bool:
        """Room for its tokens and its whole budget left, with the running requests'
        budgets left reserved: at the current ratio, or whole for those admitted in this
        pass (``this_pass``: their ids)."""
        if self.max_total is None:
            return True
        reserved = sum(self._reserved(j, whole=id(j) in this_pass) for j in self._running)
        need = job.held + self._reserved(job, whole=True)
        return sum(j.held for j in self._running) + reserved + need <= self.max_total

    def _reserved(self, job: _Job, whole: bool = False) -> float:
        """The room admission keeps for a request's budget left (at most 4,096 tokens):
        all of it when ``whole`` or for a fixed-length (ignore_eos) request, as SGLang's
        PrefillAdder does ("fixed-length requests cannot benefit from the early-EOS
        estimate"), else the ratio's share of it."""
        left = min(max(job.max_new - job.decoded, 0.0), CLIP_MAX_NEW_TOKENS)
        return left if whole or job.fixed_length else self._ratio * left

    def _decoding(self) -> list[_Job]:
        return [j for j in self._running if j.prefill_left_s <= 0]

    def _retract(self) -> None:
        """Take back requests until the next decode step fits the pool."""
        if self.max_total is None:
            return
        taken = 0
        while len(self._running) > 1 and (sum(j.held for j in self._running)
                                          + len(self._decoding()) > self.max_total):
            victim = min(self._running, key=lambda j: (j.decoded, -j.prompt_tokens))
            self._running.remove(victim)
            victim.retractions += 1
            # its output is kept; prompt + output are prefilled again when it returns
            victim.prefill_left_s = (victim.prompt_tokens + int(victim.decoded)) / self.prefill_tok_s
            kept = min(int(victim.decoded), victim.reported)  # counted tokens move over
            victim.prompt_tokens += kept
            victim.max_new -= kept
            victim.total_tokens -= kept
            victim.retracted_tokens += kept
            victim.decoded -= kept
            victim.reported -= kept
            self._queue.appendleft(victim)
            taken += 1
        if taken:
            self._pool_full = False
            self.retractions_total += taken
            self.last_retracted = taken
            left = sum(j.max_new for j in self._running)
            done = sum(j.decoded for j in self._running)
            self._ratio = min(1.0, (done + RETRACT_DECODE_STEPS * len(self._running)) / left) \
                if left else self._ratio

    def _pool_full_wall_s(self) -> float | None:
        """Wall seconds until the next decode step no longer fits (None: no pool)."""
        if self.max_total is None or len(self._running) < 2:
            return None
        decoding = self._decoding()
        rate = self._rate()
        growth = sum(rate / j.slow_factor for j in decoding)
        if growth <= 0:
            return None
        room = self.max_total - sum(j.held for j in self._running) - len(decoding)
        # just past the room: the step after it no longer fits (at 0 the loop would spin)
        return (max(room, 0.0) + 1e-3) / growth * self.time_scale

    def _next_completion_wall_s(self) -> float | None:
        if not self._running:
            return None
        rate = self._rate()
        events = [self._remaining_wall_s(j, rate) for j in self._running]
        if self.max_total is not None:  # a prefill's end starts its growth; the pool's end
            events += [j.prefill_left_s * self.time_scale for j in self._running
                       if j.prefill_left_s > 0]
            full = self._pool_full_wall_s()
            if full is not None:
                events.append(full)
        return max(min(events), 0.0)

    def _drop(self, job: _Job) -> None:
        """Remove a cancelled request; its decoded tokens stay counted (they were generated)."""
        self._advance(time.monotonic())
        if job in self._queue:
            self._queue.remove(job)
        elif job in self._running:
            self._running.remove(job)
            self._pool_full = False
            if self._driver is not None:
                self._wake.set()  # the others speed up now

    # ---- counters -------------------------------------------------------
    def _complete_counts(self, completion_tokens: int, verify_steps: int,
                         spec_tokens: Optional[int] = None) -> None:
        """``completion_tokens`` not yet counted; ``spec_tokens``: its whole output."""
        self.generation_tokens_total += completion_tokens
        self.requests_total += 1
        if verify_steps:
            self._spec_recent.append((spec_tokens or completion_tokens, verify_steps))

    def _record_sample(self, now: float) -> None:
        if self._samples and now - self._samples[-1][0] < SAMPLE_SPACING_S and len(self._samples) > 1:
            self._samples[-1] = (now, self._gen_cum)
        else:
            self._samples.append((now, self._gen_cum))

    def _throughput(self, now: float) -> float:
        """Decoded tokens per wall second over the last THROUGHPUT_WINDOW_S (linear between samples)."""
        target = now - THROUGHPUT_WINDOW_S
        s = self._samples
        while len(s) >= 2 and s[1][0] <= target:
            s.popleft()
        t0, c0 = s[0]
        if t0 < target and len(s) >= 2:
            t1, c1 = s[1]
            c0 = c0 + (c1 - c0) * (target - t0) / (t1 - t0) if t1 > t0 else c1
            t0 = target
        span = now - t0
        return (self._gen_cum - c0) / span if span > 0 else 0.0
