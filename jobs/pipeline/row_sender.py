"""Send rows to the engine replicas in chunks, while in-flight slots stay per row.

One Serve handle call costs the caller and the replica several ms of CPU (routing,
pickling, Serve's bookkeeping), more than the row's own HTTP work. So up to
``rows_per_call`` rows go out as ONE streaming ``generate_many`` call, and each result
is handed to its row as the replica streams it back (completion order). A row holds
its in-flight slot from send until its own result arrives, never until its chunk ends,
so a slow 8K-token row holds one slot.

A chunk goes when it is full or ``linger_s`` after its first row got a slot. When all
slots are busy (the steady state), slots come back one finished row at a time; the
linger lets a few gather instead of paying a call per row. It delays a refill by at
most ``linger_s``, which the engines' queued requests cover (rows run for seconds on
the simulator, minutes on GPUs).

How many slots there are: ``inflight_rows``, fixed (job.inflight: fixed), or, with an
InflightControl (job.inflight: adaptive), its ``limit``, which moves with the engines'
load reported on each result (jobs/pipeline/inflight.py); a lowered limit takes no row
back, it only holds the next ones until enough rows finished.

``send(request, alone=True)`` gives a row a call of its own: after replica code raised
on a shared call, each of its rows is sent alone so only the poison row fails.

Results are matched to their rows by ``request_id`` (unique per send), not by row key:
a call carrying one key twice (a duplicated row) still answers both. A call whose
stream sends nothing for ``call_timeout_s`` (the engine's own request timeout plus a
margin: no row can legitimately take longer) fails its waiting rows with CallTimedOut,
so a stuck replica costs a retry, never a hang.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Optional

from contract.protocol import GenerateRequest, GenerateResult
from jobs.pipeline.inflight import InflightControl
from jobs.pipeline.retry import CallIncomplete, CallTimedOut

logger = logging.getLogger(__name__)


class RowSender:
    def __init__(self, handle: Any, inflight_rows: int, rows_per_call: int,
                 linger_s: float = 0.2, call_timeout_s: Optional[float] = None,
                 control: Optional[InflightControl] = None):
        self.stream = handle.options(stream=True)
        self.rows_per_call = rows_per_call
        self.linger_s = linger_s
        self.call_timeout_s = call_timeout_s
        self.control = control  # None: a fixed inflight_rows (job.inflight: fixed)
        self._sent = 0  # request ids: unique per send of this sender
        self._fixed = inflight_rows
        self._busy = 0  # slots taken; only the dispatcher takes them
        self.peak_busy = 0
        self._queue: deque[tuple[GenerateRequest, asyncio.Future, bool]] = deque()
        self._changed: Optional[asyncio.Event] = None  # a row queued or a slot freed
        self._dispatcher: Optional[asyncio.Task] = None
        self._calls: set[asyncio.Task] = set()  # the loop keeps only weak references

    async def send(self, request: GenerateRequest, alone: bool = False) -> GenerateResult:
        """The replica's result for one request; raises what the handle call raised."""
        if self._dispatcher is None or self._dispatcher.done():
            self._start()
        self._sent += 1
        request.request_id = f"{request.key}#{self._sent}"
        future = asyncio.get_running_loop().create_future()
        self._queue.append((request, future, alone))
        self._changed.set()
        return await future

    def _start(self) -> None:  # inside the actor's event loop
        if self._changed is None:
            self._changed = asyncio.Event()
        self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch())
        self._dispatcher.add_done_callback(self._dispatcher_ended)

    def _dispatcher_ended(self, task: asyncio.Task) -> None:
        # Never leave a row waiting on a dead dispatcher: fail what is queued (the caller
        # retries it) and let the next send start a new one.
        if task.cancelled() or task is not self._dispatcher:  # a newer one owns the queue
            return
        exc = task.exception()
        if exc is not None:
            logger.error("row dispatcher failed: %r", exc)
            while self._queue:
                _, future, _ = self._queue.popleft()
                if not future.done():
                    future.set_exception(exc)

    @property
    def limit(self) -> int:
        """The rows this sender keeps in flight now."""
        return self.control.limit if self.control is not None else self._fixed

    @property
    def _free(self) -> int:
        return self.limit - self._busy

    def _chunk_rows(self) -> int:
        """Most rows the next call takes: rows_per_call; adaptive, also at most a half of
        each engine's share of the limit, so every engine has calls enough for Serve's
        routing (by ongoing calls, not rows) to see its load."""
        if self.control is None:
            return self.rows_per_call
        engines = max(1, len(self.control.engines))
        return max(1, min(self.rows_per_call, self.limit // (2 * engines)))

    def _take(self) -> None:
        self._busy += 1
        self.peak_busy = max(self.peak_busy, self._busy)

    def _release(self, load: Optional[dict] = None) -> None:
        self._busy -= 1
        if self.control is not None and load is not None:
            self.control.observe(load)
        self._changed.set()

    async def _wait_change(self, deadline: Optional[float]) -> bool:
        """Wait until a row is queued or a slot freed; False once the deadline passed."""
        self._changed.clear()
        timeout = None if deadline is None else deadline - asyncio.get_running_loop().time()
        if timeout is not None and timeout <= 0:
            return False
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not (self._queue and self._free > 0):  # the first row needs a row and a slot
                await self._wait_change(None)
            chunk, deadline, most = [], loop.time() + self.linger_s, self._chunk_rows()
            try:
                while len(chunk) < most:
                    if chunk and (chunk[0][2] or (self._queue and self._queue[0][2])):
                        break  # a row sent alone shares its call with no other
                    if self._queue and self._free > 0:
                        self._take()
                        chunk.append(self._queue.popleft())
                    elif not await self._wait_change(deadline):
                        break
            except BaseException as exc:  # the rows taken so far are not lost either
                for _, future, _ in chunk:
                    self._release()
                    if not future.done():
                        future.set_exception(exc)
                raise
            call = loop.create_task(self._call(chunk))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)

    async def _results(self, requests: list[GenerateRequest]):
        """The call's stream, each result within the call's deadline."""
        loop = asyncio.get_running_loop()
        deadline = None if self.call_timeout_s is None else loop.time() + self.call_timeout_s
        stream = self.stream.generate_many.remote(requests).__aiter__()
        while True:
            timeout = None if deadline is None else max(deadline - loop.time(), 0.0)
            try:
                yield await asyncio.wait_for(stream.__anext__(), timeout)
            except StopAsyncIteration:
                return
            except asyncio.TimeoutError:
                raise CallTimedOut(
                    f"the replica sent no result for {self.call_timeout_s:.0f} s (longer than "
                    f"any row may take): a stuck replica or engine") from None

    async def _call(self, chunk: list[tuple[GenerateRequest, asyncio.Future, bool]]) -> None:
        waiting = {request.request_id: (request.key, future) for request, future, _ in chunk}
        try:
            async for result in self._results([r for r, _, _ in chunk]):
                rid = getattr(result, "request_id", "") or next(  # a replica that predates ids
                    (r for r, (key, _) in waiting.items() if key == result.key), None)
                _, future = waiting.pop(rid, (None, None))
                if future is not None:
                    self._release(getattr(result, "load", None))
                    if not future.done():
                        future.set_result(result)
            if waiting:
                raise CallIncomplete(f"generate_many ended without {len(waiting)} of its rows")
        except BaseException as exc:  # every row still waiting gets the call's error
            for _, future in waiting.values():
                self._release()
                if not future.done():
                    future.set_exception(exc)
            waiting.clear()
            if not isinstance(exc, Exception):
                raise
