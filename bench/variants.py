"""Experimental variants of raygen's generate stage, to measure proposed changes.

They are not raygen: ``python -m bench --variant chunked`` swaps them into
jobs.pipeline for the raygen mode only, so one run can show the effect of a change
before anyone edits jobs/. BENCHMARKS.md reports what they measured.

- ``chunked``: GenerateRows whose per-row ``_call`` goes through a per-actor
  batcher: rows waiting for a request are sent ``CHUNK`` at a time in ONE
  streaming ``generate_many`` handle call (the method the deployment already has),
  and each row's result is delivered as the replica streams it back. In-flight
  accounting stays per row (a permit per row, released when its result arrives),
  so a slow row holds one slot, not its chunk. Retries, breaker and row building
  are GenerateRows' own (``_one`` is unchanged).
- ``fastrep``: ``jobs.rows.repetition_ratio`` computed with ``set(zip(...))``
  (same result, ~2x less CPU) in the generate actors.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from jobs.generate_stage import GenerateRows

CHUNK = 16
LINGER_S = 0.002


def repetition_ratio_zip(ids: list[int], n: int = 4) -> float:
    total = len(ids) - n + 1
    if total <= 0:
        return 0.0
    return 1.0 - len(set(zip(*(ids[i:] for i in range(n))))) / total


def _patch_repetition_ratio() -> None:
    import jobs.rows
    jobs.rows.repetition_ratio = repetition_ratio_zip


class GenerateRowsFastRep(GenerateRows):
    def __init__(self, app_name: str, deployment_name: str, ctx: dict[str, Any]):
        _patch_repetition_ratio()
        super().__init__(app_name, deployment_name, ctx)


class GenerateRowsChunked(GenerateRows):
    def __init__(self, app_name: str, deployment_name: str, ctx: dict[str, Any],
                 fast_rep: bool = True):
        if fast_rep:
            _patch_repetition_ratio()
        super().__init__(app_name, deployment_name, ctx)
        self.stream = self.handle.options(stream=True)
        self._queue: list[tuple[dict[str, Any], asyncio.Future]] = []
        self._wake: Optional[asyncio.Event] = None

    def _start(self) -> None:
        self._slots = asyncio.Semaphore(self.ctx["inflight_rows_per_actor"])
        self._wake = asyncio.Event()
        asyncio.get_running_loop().create_task(self._dispatch())

    async def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        if self._wake is None:
            self._start()
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((request, fut))
        self._wake.set()
        return await fut

    async def _dispatch(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                if len(self._queue) < CHUNK:
                    await asyncio.sleep(LINGER_S)  # let concurrent batches add rows
                take, self._queue = self._queue[:CHUNK], self._queue[CHUNK:]
                for _ in take:
                    await self._slots.acquire()
                asyncio.get_running_loop().create_task(self._send(take))

    async def _send(self, take: list[tuple[dict[str, Any], asyncio.Future]]) -> None:
        waiting = {req["key"]: fut for req, fut in take}
        try:
            async for result in self.stream.generate_many.remote([r for r, _ in take]):
                fut = waiting.pop(result["key"], None)
                if fut is not None:
                    self._slots.release()
                    if not fut.done():
                        fut.set_result(result)
        except BaseException as exc:  # noqa: BLE001 - every waiting row gets the error
            for fut in waiting.values():
                if not fut.done():
                    fut.set_exception(exc)
        finally:
            for fut in waiting.values():
                self._slots.release()
                if not fut.done():
                    fut.set_exception(RuntimeError("generate_many ended without this row"))


VARIANTS = {"chunked": GenerateRowsChunked, "fastrep": GenerateRowsFastRep}
