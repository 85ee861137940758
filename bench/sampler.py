"""RSS sampler process: ``python -m bench.sampler --root PID --period 0.5 --out FILE``.

Samples the RSS of the root's process tree by role (bench.procs) every period until
SIGTERM, then writes the peaks as JSON. A separate process, so the sampling (which
walks /proc) neither costs the driver CPU nor competes for the driver's GIL; it
excludes itself (bench.procs.EXCLUDE_MARKERS).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from bench.procs import ROLES, ProcTree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", type=int, required=True)
    parser.add_argument("--period", type=float, default=0.5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    tree = ProcTree(root_pid=args.root)
    peak = dict.fromkeys(ROLES, 0)
    peak_total, samples = 0, 0
    while True:
        try:
            snap = tree.snapshot()
        except Exception:  # noqa: BLE001 - the root is gone: stop
            break
        for role, value in snap.rss.items():
            peak[role] = max(peak[role], value)
        peak_total = max(peak_total, snap.rss["driver"] + snap.rss["ray_workers"]
                         + snap.rss["serve"])
        samples += 1
        if stop.wait(args.period):
            break
    with open(args.out, "w") as f:
        json.dump({"peak": peak, "peak_total": peak_total, "samples": samples}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
