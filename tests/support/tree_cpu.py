"""CPU seconds a process and everything below it have used (Linux /proc), sampled.

`make test` is CPU-bound on 2 cores, so what a test costs the suite is its CPU, not the
seconds it waits: a trial that sleeps through a 30 s outage costs little, one whose
engines decode for 10 s costs much, whatever its wall time on a loaded machine. Each
xdist worker's Ray cluster, S3 server, engines and driver subprocesses are its
descendants (ray.init starts the GCS and raylet below the test process, and the raylet
every worker), so a test's CPU is what its worker's process tree used from its setup to
the end of its teardown, charged by tests/conftest.py to the test's module beside its
wall time (tests/support/budget.py).

Sampled, not read once at each end: Ray's raylet does not wait for the workers it starts,
so a worker that ended (a session's generate actor) leaves no trace in its parent's
children-time. A thread reads every process of the tree each PERIOD_S and keeps each
one's last CPU; an ended process counts up to its last sample (at most PERIOD_S of its
life lost), one that lives less than PERIOD_S may be missed.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Optional

HZ = os.sysconf("SC_CLK_TCK")
PERIOD_S = 3.0  # a sample reads every process of the machine (~15 ms of CPU at ~300 processes)


def _stat(pid: str) -> Optional[tuple[int, str, float]]:
    """(ppid, start time in ticks, utime + stime seconds) of a process, None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone between the listing and the read
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # the name in (...) may hold spaces
    return int(fields[1]), fields[19], (int(fields[11]) + int(fields[12])) / HZ


def tree(root: int) -> dict[tuple[int, str], float]:
    """(pid, start) -> CPU seconds of ``root`` and each of its live descendants."""
    children: dict[int, list[int]] = defaultdict(list)
    stats: dict[int, tuple[str, float]] = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit() and (stat := _stat(pid)) is not None:
            children[stat[0]].append(int(pid))
            stats[int(pid)] = stat[1:]
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            start, cpu = stats[pid]
            out[(pid, start)] = cpu
        todo.extend(children.get(pid, ()))
    return out


class TreeCpu:
    """The CPU seconds this process's tree has used since it was created, ended processes
    included up to their last sample (a thread samples every ``period_s``)."""

    def __init__(self, root: Optional[int] = None, period_s: float = PERIOD_S) -> None:
        self.root = os.getpid() if root is None else root
        self.period_s = period_s
        self._seen: dict[tuple[int, str], float] = {}
        self._base = dict(tree(self.root))  # what the tree had used before: not counted
        self._lock = threading.Lock()
        threading.Thread(target=self._loop, name="tree-cpu", daemon=True).start()

    def _loop(self) -> None:
        while True:
            time.sleep(self.period_s)
            self.sample()

    def sample(self) -> None:
        now = tree(self.root)
        with self._lock:
            self._seen.update(now)

    def total_s(self) -> float:
        """Sampled now: CPU seconds used by the tree since this object was made."""
        self.sample()
        with self._lock:
            return sum(cpu - self._base.get(key, 0.0) for key, cpu in self._seen.items())
