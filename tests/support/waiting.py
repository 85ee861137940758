"""Wait on a condition with a deadline instead of sleeping a fixed time."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")

# Polls start fast and slow down: a condition met within a second is seen within ~0.1 s,
# a long wait polls twice a second. Most predicates read S3 (progress.json, a listing, a
# whole run): at a fixed 0.1 s the suite's waits made moto and the test processes busy
# enough to slow the runs they were waiting for, on a 2-core machine.
FIRST_POLL_S = 0.05
MAX_POLL_S = 0.5


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str,
               poll_s: float = MAX_POLL_S) -> T:
    """predicate()'s first truthy value; AssertionError naming ``what`` at the deadline.
    Polls every FIRST_POLL_S at first, backing off to ``poll_s``."""
    deadline = time.monotonic() + timeout_s
    pause = min(FIRST_POLL_S, poll_s)
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 1.5, poll_s)
