"""Where a command's CPU goes: run it, sample /proc beside it, print CPU seconds per
process title.

    python -m tests.support.cpu_profile --out /tmp/cpu.txt -- make test

`make test` on this 2-core machine is CPU-bound (load average ~17-29 while it runs), so
its wall time is about its CPU seconds over two: the ledger's module sums say which test
waits, this says which process burns. Every process seen is charged its CPU time at its
last sample (one that lives shorter than a period may be missed, and a process's last
period is lost); the total busy CPU of the machine (/proc/stat) is printed beside it,
which counts everything. A process is named by the titles it showed (Ray workers retitle
themselves per task: ``ray::IDLE | ray::Write``), arguments after the first flag dropped.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Optional

HZ = os.sysconf("SC_CLK_TCK")
TITLE_WORDS = 3     # words of a command line kept in its label (flags dropped)
TITLE_CHARS = 120

# (pid, start time in clock ticks) -> [CPU seconds, labels in the order shown]
Seen = dict[tuple[int, str], list]


def label(cmdline: str) -> str:
    """A command line as a label: its first words, without flags."""
    words = [w for w in cmdline.split()[:TITLE_WORDS] if not w.startswith("-")]
    return " ".join(words)[:TITLE_CHARS]


def _read(pid: str) -> Optional[tuple[str, float, str]]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:  # gone between the listing and the read
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # the name in (...) may hold spaces
    cpu_s = (int(fields[11]) + int(fields[12])) / HZ  # utime + stime
    return fields[19], cpu_s, cmdline  # starttime tells a reused pid apart


def sample(seen: Seen) -> None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        read = _read(pid)
        if read is None:
            continue
        start, cpu_s, cmdline = read
        entry = seen.setdefault((int(pid), start), [0.0, []])
        entry[0] = cpu_s
        name = label(cmdline)
        if name and name not in entry[1]:
            entry[1].append(name)


def summarize(seen: Seen, since: Optional[Seen] = None) -> list[tuple[float, int, str]]:
    """(CPU seconds, processes, label) per label, most first; ``since``: a sample taken
    before the command started, whose CPU is not charged to it."""
    cpu: dict[str, float] = defaultdict(float)
    count: Counter = Counter()
    for key, (cpu_s, names) in seen.items():
        name = " | ".join(names[:2]) or "(no command line: kernel thread or zombie)"
        cpu[name] += cpu_s - (since.get(key, [0.0])[0] if since else 0.0)
        count[name] += 1
    return sorted(((s, count[n], n) for n, s in cpu.items()), reverse=True)


def busy_cpu_s() -> float:
    """Busy CPU seconds of the whole machine since boot (every process, dead ones too)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / HZ  # minus idle and iowait


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the full table goes here")
    parser.add_argument("--period", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--top", type=int, default=25, help="rows printed")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    before: Seen = {}
    sample(before)
    busy0, t0 = busy_cpu_s(), time.monotonic()
    proc = subprocess.Popen(command)
    seen: Seen = {}
    while proc.poll() is None:
        sample(seen)
        time.sleep(args.period)
    sample(seen)
    busy, wall = busy_cpu_s() - busy0, time.monotonic() - t0
    rows = summarize(seen, since=before)
    charged = sum(s for s, _, _ in rows)
    shown = " ".join(command).replace("\n", "; ")  # the header stays one line
    lines = [f"{shown}: exit {proc.returncode}, wall {wall:.0f} s, machine busy "
             f"{busy:.0f} CPU-s ({busy / wall:.2f} cores), charged to processes seen "
             f"{charged:.0f} CPU-s", "CPU-s  procs  process"]
    lines += [f"{s:6.1f} {n:6d}  {name}" for s, n, name in rows if s >= 0.5]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:args.top + 2]))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
