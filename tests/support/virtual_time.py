"""Run a coroutine on an event loop whose clock is simulated: when nothing is ready, the
clock jumps to the next timer instead of sleeping. Timing code that reads the loop's
clock (or time.monotonic patched to it) is then tested exactly, and instantly."""

from __future__ import annotations

import asyncio
import selectors
from typing import Any, Awaitable, Callable


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class _JumpingSelector(selectors.DefaultSelector):
    """select() never blocks: it advances the clock by the loop's wait instead."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout: float | None = None) -> list:
        events = super().select(0)
        if not events and timeout:
            self.clock.now += timeout
        elif not events and timeout is None:
            raise RuntimeError("the virtual-time loop has nothing scheduled: it would wait forever")
        return events


def run_virtual(main: Callable[[], Awaitable[Any]], clock: VirtualClock | None = None) -> Any:
    """asyncio.run(main()) on a loop that reads ``clock`` (a new one by default)."""
    clock = clock or VirtualClock()
    loop = asyncio.SelectorEventLoop(_JumpingSelector(clock))
    loop.time = clock.monotonic  # type: ignore[method-assign]
    runner = asyncio.Runner(loop_factory=lambda: loop)
    with runner:
        return runner.run(main())
