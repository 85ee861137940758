"""Wait on a condition with a deadline instead of sleeping a fixed time."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str,
               poll_s: float = 0.1) -> T:
    """predicate()'s first truthy value; AssertionError naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)
