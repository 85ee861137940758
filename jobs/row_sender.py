"""Send rows to the engine replicas in chunks, while in-flight slots stay per row.

One Serve handle call costs the caller and the replica a few ms of CPU (routing,
pickling, Serve's bookkeeping), far more than the row's own HTTP work. So rows that
are ready together go out as ONE streaming ``generate_many`` call of up to
``rows_per_call`` rows, and each result is handed to its row as the replica streams it
back (completion order). A row holds its in-flight slot from send until its own
result arrives, never until its chunk ends, so a slow 8K-token row holds one slot.

Chunks only form when rows and free slots are there together (start-up, fast rows);
in a GPU-bound steady state a finished row frees one slot and the next row goes out
alone at once, so the engines' queues are refilled without delay.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Optional

from jobs.retry import CallIncomplete

logger = logging.getLogger(__name__)
LINGER_S = 0.002  # lets concurrent batches add their rows before a short chunk goes


class RowSender:
    def __init__(self, handle: Any, inflight_rows: int, rows_per_call: int):
        self.stream = handle.options(stream=True)
        self.inflight_rows = inflight_rows
        self.rows_per_call = rows_per_call
        self._queue: deque[tuple[dict[str, Any], asyncio.Future]] = deque()
        self._slots: Optional[asyncio.Semaphore] = None
        self._wake: Optional[asyncio.Event] = None
        self._dispatcher: Optional[asyncio.Task] = None

    async def send(self, request: dict[str, Any]) -> dict[str, Any]:
        """The replica's result for one request; raises what the handle call raised."""
        if self._dispatcher is None or self._dispatcher.done():
            self._start()
        future = asyncio.get_running_loop().create_future()
        self._queue.append((request, future))
        self._wake.set()
        return await future

    def _start(self) -> None:  # inside the actor's event loop
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.inflight_rows)
            self._wake = asyncio.Event()
        self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch())
        self._dispatcher.add_done_callback(self._dispatcher_ended)

    def _dispatcher_ended(self, task: asyncio.Task) -> None:
        # Never leave a row waiting on a dead dispatcher: fail what is queued (the caller
        # retries it) and let the next send start a new one.
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            logger.error("row dispatcher failed: %r", exc)
            while self._queue:
                _, future = self._queue.popleft()
                if not future.done():
                    future.set_exception(exc)

    async def _dispatch(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                if len(self._queue) < self.rows_per_call and not self._slots.locked():
                    await asyncio.sleep(LINGER_S)
                await self._slots.acquire()  # the first row waits for a slot ...
                chunk = [self._queue.popleft()]
                # ... the rest only take slots that are free now
                while (self._queue and len(chunk) < self.rows_per_call
                       and not self._slots.locked()):
                    await self._slots.acquire()
                    chunk.append(self._queue.popleft())
                asyncio.get_running_loop().create_task(self._call(chunk))

    async def _call(self, chunk: list[tuple[dict[str, Any], asyncio.Future]]) -> None:
        waiting = {request["key"]: future for request, future in chunk}
        try:
            async for result in self.stream.generate_many.remote([r for r, _ in chunk]):
                future = waiting.pop(result["key"], None)
                if future is not None:
                    self._slots.release()
                    if not future.done():
                        future.set_result(result)
            if waiting:
                raise CallIncomplete(f"generate_many ended without {len(waiting)} of its rows")
        except BaseException as exc:  # every row still waiting gets the call's error
            for future in waiting.values():
                self._slots.release()
                if not future.done():
                    future.set_exception(exc)
            waiting.clear()
            if not isinstance(exc, Exception):
                raise
