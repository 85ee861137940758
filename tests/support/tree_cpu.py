"""CPU seconds a process and everything below it have used (Linux /proc).

`make test` is CPU-bound on 2 cores, so what a test costs the suite is its CPU, not the
seconds it waits: a trial that sleeps through a 30 s outage costs little, one whose
engines decode for 10 s costs much, whatever its wall time on a loaded machine. Each
xdist worker's Ray cluster, S3 server, engines and driver subprocesses are its children
(ray.init starts the GCS and raylet below the test process, and the raylet every worker),
so a test's CPU is the growth of its worker's process tree over the test, charged by
tests/conftest.py to the test's module beside its wall time (tests/support/budget.py).
A process counts its own time and its reaped children's (cutime), so the CPU of a process
that ended is kept by its parent; one re-parented to init before it ended is lost.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Optional

HZ = os.sysconf("SC_CLK_TCK")


def _stat(pid: str) -> Optional[tuple[int, float]]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone between the listing and the read
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # the name in (...) may hold spaces
    # ppid; utime + stime + cutime + cstime
    return int(fields[1]), sum(int(v) for v in fields[11:15]) / HZ


def tree_cpu_s(root: Optional[int] = None) -> float:
    """CPU seconds of ``root`` (default: this process) and its descendants, reaped ones
    included."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = defaultdict(list)
    cpu: dict[int, float] = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit() and (stat := _stat(pid)) is not None:
            children[stat[0]].append(int(pid))
            cpu[int(pid)] = stat[1]
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo.extend(children.get(pid, ()))
    return total
