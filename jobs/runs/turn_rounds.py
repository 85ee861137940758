"""Rounds of every-turn regeneration (job.regenerate every_turn): one turn per session.

The first session of a command is the run's ordinary admission session: it generates
turn 1 of every new conversation (jobs/pipeline/turns.py builds its prompt) and writes
version 0. Then jobs.generate runs round sessions (``RunMode`` kind next-turn) while
conversations are open: each sends the next turn of every conversation whose latest row
has no ``turn_stop`` and writes it as that row's next version, holding all its turns so
far. A round is an ordinary session (the lease, progress.json, the watchdog, the
report), so a kill anywhere loses at most the turns not yet durable: the next command's
rounds start from each conversation's latest version (the run index's winners), so a
resumed round may mix turn k of some conversations with turn k + 1 of others, and every
turn is written once. Rounds stop when none is open, or when a round wrote nothing
(every open row failed with a retryable error: the next command retries them).
"""

from __future__ import annotations

import collections
import logging
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from jobs.io.run_index import RunIndex
from jobs.io.run_store import RunStore
from jobs.runs.errors import RunError

logger = logging.getLogger("raygen")
MAX_ROUNDS = 10_000  # a guard, never reached: every round ends or advances each conversation


def _latest(store: RunStore, index: RunIndex):
    """(path, row positions, their turn_stop / settings_hash / turns columns) per part
    holding latest rows."""
    for path, rows in index.winners_by_part().items():
        t = store.read_part(path, ["turn_stop", "settings_hash", "turns"])
        if t.num_rows:  # else quarantined since the index read its sidecar: not done
            yield path, rows, t.take(pa.array(rows))


def open_rows(store: RunStore, index: RunIndex, settings_hash: str) -> dict[str, list[int]]:
    """data part path -> positions of the latest rows whose conversation goes on. Reads
    the turn_stop and settings_hash columns of the parts holding latest rows."""
    found: dict[str, list[int]] = {}
    others = 0
    for path, rows, t in _latest(store, index):
        going = pc.and_(pc.is_null(t["turn_stop"]), pc.is_valid(t["turns"])).to_pylist()
        hashes = t["settings_hash"].to_pylist()
        picked = [int(r) for r, ok in zip(rows, going) if ok]
        others += sum(1 for ok, h in zip(going, hashes) if ok and h != settings_hash)
        if picked:
            found[path] = picked
    if others:
        raise RunError(f"{others} open conversations were generated with other settings than "
                       f"this config ({settings_hash}); finish them with the config that "
                       f"made them.")
    return found


def stop_counts(store: RunStore, index: RunIndex) -> collections.Counter:
    """turn_stop -> conversations whose latest row ended so (None: still open)."""
    counts: collections.Counter = collections.Counter()
    for _, _, t in _latest(store, index):
        counts.update(t["turn_stop"].to_pylist())
    return counts


def stops_line(counts: collections.Counter) -> str:
    mix = ", ".join(f"{n} {stop or 'open'}" for stop, n in
                    sorted(counts.items(), key=lambda kv: (-kv[1], kv[0] is None, str(kv[0]))))
    return f"  every turn: conversations {mix or 'none'}"


def pending(store: RunStore, settings_hash: str) -> int:
    return sum(len(r) for r in open_rows(store, RunIndex.open(store), settings_hash).values())


def rounds(store: RunStore, summary, settings_hash: str, session: Callable[[], Any]):
    """Round sessions (``session()``) while conversations are open, after a session that
    succeeded; the summaries' texts joined, one line per round."""
    text = summary.text
    for _ in range(MAX_ROUNDS):
        if summary.status != "succeeded":
            break
        left = pending(store, settings_hash)
        if not left:
            break
        logger.info("every-turn regeneration: %d conversations have a next turn", left)
        summary = session()
        rows = (summary.progress or {}).get("session_rows", 0)
        text += f"\n  next turn: {rows} of {left} open conversations advanced"
        if summary.status == "succeeded" and not rows:
            text += ("\n  every open conversation failed this round: rerun the same "
                     "command to retry them")
            break
    if summary.status == "succeeded":
        text += "\n" + stops_line(stop_counts(store, RunIndex.open(store)))
    summary.text = text
    return summary
