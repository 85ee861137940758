"""Tiny supervisor between a replica and its engine process.

``python -m serve_apps.engine_guard --parent-pid PID -- <engine command...>``

The replica starts this guard in a new session (so guard + engine + the engine's own
workers form one process group). The guard runs the engine and kills the whole group
when the replica disappears, even by SIGKILL, when no ``__del__`` can run. Without it,
a killed replica leaves an engine holding its GPU: the next replica then OOMs.

On Linux the kernel backs this up (``prctl(PR_SET_PDEATHSIG)``): the guard gets SIGTERM
when its replica dies and the engine gets SIGKILL when the guard dies, so an engine
cannot outlive a guard that was itself SIGKILLed (Ray kills a dead worker's children;
``ray stop`` and node loss kill everything but the engine's own session). The signal
fires when the *thread* that forked the child exits: the replica forks the guard from
a thread that lives until the guard has exited (engine_process.py), and the guard
forks the engine from its main thread.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import signal
import subprocess
import sys
import time

POLL_S = 0.5
GRACE_S = 10.0
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int, parent_pid: int) -> None:
    """Linux: the kernel sends ``sig`` to this process when its parent (thread) exits.
    Elsewhere a no-op: the guard's parent polling still applies."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before prctl: no signal will come
        os.kill(os.getpid(), sig)


def _parent_alive(pid: int) -> bool:
    if os.getppid() != pid:  # re-parented: the replica is gone
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_group(child: subprocess.Popen) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # our own killpg must not re-enter
    try:
        os.killpg(os.getpgid(0), signal.SIGTERM)
        os.killpg(os.getpgid(0), signal.SIGCONT)  # a stopped engine acts on SIGTERM only once resumed
    except ProcessLookupError:
        return
    deadline = time.monotonic() + GRACE_S
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(os.getpgid(0), signal.SIGKILL)  # also ends the guard itself


def _kill_leftovers() -> None:
    """SIGKILL every process of the guard's group but the guard. Called once the engine
    has exited by itself: what it leaves in the group (a worker it spawned and did not
    take down, as SGLang's detokenizer outlived a server whose start a loaded machine cut
    short) is an orphan holding the engine's memory, a GPU's on a real node. Linux reads
    the group from /proc; elsewhere there is nothing to read and nothing is done."""
    me, group = os.getpid(), os.getpgid(0)
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            if pid != me and int(stat[stat.rfind(")") + 2:].split()[2]) == group:
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no engine command after --")
    die_with_parent(signal.SIGTERM, args.parent_pid)  # SIGTERM: _kill_group's grace below
    # Same process group as the guard; SIGKILL when the guard dies, even by SIGKILL.
    child = subprocess.Popen(command, preexec_fn=functools.partial(
        die_with_parent, signal.SIGKILL, os.getpid()))
    signal.signal(signal.SIGTERM, lambda *_: _kill_group(child))
    while True:
        code = child.poll()
        if code is not None:
            _kill_leftovers()
            return code
        if not _parent_alive(args.parent_pid):
            # No logging first: our stdout is a pipe to the dead replica (EPIPE).
            _kill_group(child)
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
