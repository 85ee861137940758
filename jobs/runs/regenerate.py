"""Regenerate suspect rows as new versions of their keys: condemned and flagged rows.

A drained replica (serve_apps/output_watch.py: too many flagged outputs, or a canary that
disagrees with its fleet) condemns the rows of its window and those it still held; the
job records them under the run (jobs/io/condemned.py). A key is condemned
while its latest row (run_index LATEST_ORDER) is one that replica produced (data/'s
``replica`` column); once regenerated elsewhere it is not. So the rule is idempotent,
and a row the drained replica returned but the job never wrote is simply not done (a
plain resume sends it).

A regenerate session (``RunMode`` kind regenerate; ``--regenerate-flagged`` also takes
every latest row with integrity flags) sends the chosen rows' prompts again with the
run's own settings (its settings_hash and budget are checked as a fresh session's) and
writes each result as version latest + 1: a fresh output (budget_history the run's
budget, continuations 0); the run keeps every version and the run index picks the new
one. A regenerated row that is cut by length can be continued again. After a session
ends succeeded, jobs.generate runs regenerate sessions while condemned rows remain
(``FOLLOW_UPS`` at most: a fleet that keeps draining is not looped over forever).
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pyarrow as pa

from contract import drain_board
from jobs.analysis.export_shards import row_flags  # the one rule for stored-null flags
from jobs.io.condemned import FOLDER, UnknownRecord, read_records, write_record
from jobs.io.run_index import RunIndex
from jobs.io.run_store import RunStore
from jobs.io.storage import list_files
from jobs.runs.errors import RunError

logger = logging.getLogger("raygen")
FOLLOW_UPS = 3
# What a row's integrity flags are computed from when its part predates the column.
FLAG_COLUMNS = ["finish_reason", "finished_thinking", "reasoning", "answer",
                "output_token_ids", "repetition_ratio"]


# --- which rows -----------------------------------------------------------------------

@dataclass
class Targets:
    """The latest rows to regenerate: part path -> row positions, and why."""

    rows: dict[str, list[int]] = field(default_factory=dict)
    condemned: int = 0
    flagged: int = 0
    settings: collections.Counter = field(default_factory=collections.Counter)
    by_replica: collections.Counter = field(default_factory=collections.Counter)

    @property
    def total(self) -> int:
        return sum(len(r) for r in self.rows.values())


def condemned_keys(records: list[dict[str, Any]]) -> dict[str, set[str]]:
    """key -> the replicas that condemned it."""
    out: dict[str, set[str]] = collections.defaultdict(set)
    for record in records:
        for key in record["keys"]:
            out[key].add(record["replica"])
    return out


def _flags(store: RunStore, path: str, rows: list[int], t: pa.Table) -> list[list[str]]:
    """The rows' integrity flags; a part written before the column is checked now."""
    if t.column("integrity_flags").null_count:
        t = store.read_part(path, ["integrity_flags"] + FLAG_COLUMNS).take(pa.array(rows))
    return row_flags(t)


def targets(store: RunStore, index: RunIndex, flagged: bool) -> Targets:
    """The latest rows a drained replica condemned (and, with ``flagged``, those with
    integrity flags). Reads the records, then only the small columns of the parts that
    hold latest rows (and none at all when there is nothing to look for)."""
    try:
        condemned = condemned_keys(read_records(store))
    except UnknownRecord as exc:
        raise RunError(str(exc)) from None
    found = Targets()
    if not condemned and not flagged:
        return found
    columns = ["key", "replica", "settings_hash", "integrity_flags"]
    for path, rows in index.winners_by_part().items():
        rows = rows.tolist()
        t = store.read_part(path, columns)
        if not t.num_rows:  # quarantined since the index read its sidecar: not done
            continue
        t = t.take(pa.array(rows))
        keys, replicas = t.column("key").to_pylist(), t.column("replica").to_pylist()
        hit_flags = _flags(store, path, rows, t) if flagged else [[]] * len(rows)
        chosen = []
        for pos, key, replica, settings, flags in zip(
                rows, keys, replicas, t.column("settings_hash").to_pylist(), hit_flags):
            by_drain = replica in condemned.get(key, ())
            if by_drain or flags:
                chosen.append(pos)
                found.settings[settings] += 1
                if by_drain:
                    found.condemned += 1
                    found.by_replica[replica] += 1
                else:
                    found.flagged += 1
        if chosen:
            found.rows[path] = chosen
    return found


def check_settings(found: Targets, settings_hash: str) -> None:
    """A regenerated row is written under this config's settings: refuse rows made under
    others (the run would then hold two settings' outputs as latest rows)."""
    other = {h: n for h, n in found.settings.items() if h != settings_hash}
    if other:
        listed = ", ".join(f"{h} ({n} rows)" for h, n in sorted(other.items(), key=str))
        raise RunError(
            f"{sum(other.values())} rows to regenerate were generated with other settings "
            f"({listed}) than this config ({settings_hash}); regenerate them with the config "
            f"that made them.")


def describe(found: Targets) -> str:
    drained = ", ".join(f"{r} {n}" for r, n in sorted(found.by_replica.items()))
    return (f"{found.total} rows ({found.condemned} condemned by drained replicas"
            + (f": {drained}" if drained else "") + f", {found.flagged} flagged)")


# --- after a session -------------------------------------------------------------------

def collect_published(store: RunStore, run: str) -> int:
    """Write the records drained replicas published in the cluster for ``run``
    (contract/drain_board.py: a drain none of whose results reached the job) under the
    run, then drop them there; how many. The lease holder's, at a session's end."""
    found = drain_board.published(run)
    for entry, record in found:
        write_record(store, record)  # the same bytes a result-carried record gives
        drain_board.remove(entry)
    if found:
        logger.warning("recorded %d drained replicas' condemned rows from the cluster: %s",
                       len(found), ", ".join(r["replica"] for _, r in found))
    return len(found)


def pending(store: RunStore) -> int:
    """Condemned rows not regenerated yet (0 without opening the index when the run has
    no record)."""
    if not list_files(store.loc(FOLDER), ".json"):
        return 0
    return targets(store, RunIndex.open(store), flagged=False).total


def follow_up(store: RunStore, summary, session: Callable[[], Any]):
    """Regenerate sessions (``session()``) while condemned rows remain after a session
    that succeeded; the summaries' texts joined."""
    text = summary.text
    for _ in range(FOLLOW_UPS):
        if summary.status != "succeeded":
            break
        left = pending(store)
        if not left:
            break
        logger.warning("%d rows condemned by drained replicas: regenerating them as new "
                       "versions", left)
        summary = session()
        text += "\n" + summary.text
    else:
        left = pending(store) if summary.status == "succeeded" else 0
        if left:
            text += (f"\n  condemned: {left} rows of drained replicas are still to "
                     f"regenerate: run `raygen generate --config ... --regenerate-flagged`")
    summary.text = text
    return summary


# --- what is left flagged ------------------------------------------------------------

KEYS_IN_PROGRESS = 20   # flagged latest rows progress.json names by key


def flagged_fields(report: dict[str, Any]) -> dict[str, Any]:
    """What progress.json says of the latest rows still flagged at a session's end (the
    report counted them: jobs/analysis/report.py flagged_stats)."""
    flagged = report.get("flagged") or {}
    return {"flagged_latest": flagged.get("rows", 0),
            "flagged_latest_by_flag": flagged.get("by_flag", {}),
            "flagged_latest_keys": [{"key": k["key"], "version": k["version"]}
                                    for k in flagged.get("keys", [])[:KEYS_IN_PROGRESS]]}


def flagged_line(snap: Optional[dict[str, Any]]) -> str:
    """The summary's line for latest rows that still carry integrity flags after the
    drains' rows were regenerated: a prompt the model itself loops on, most likely (the
    same flags on every engine). Empty when none."""
    n = (snap or {}).get("flagged_latest") or 0
    if not n:
        return ""
    kinds = ", ".join(f"{k} {v}" for k, v in (snap.get("flagged_latest_by_flag") or {}).items())
    keys = snap.get("flagged_latest_keys") or []
    named = ", ".join(f"{k['key']} (version {k['version']})" for k in keys[:5])
    more = f" and {n - min(len(keys), 5)} more" if n > min(len(keys), 5) else ""
    return (f"  flagged:   {n} latest rows still carry integrity flags ({kinds}): {named}"
            f"{more} (report.md lists them; version = earlier tries); export leaves them "
            f"out; `raygen generate --config ... --regenerate-flagged` tries them again")


def session_line(snap: Optional[dict[str, Any]]) -> str:
    """The summary's line of a regenerate session."""
    rows = (snap or {}).get("session_rows", 0)
    return f"  regenerated: {rows} rows as new versions of their keys"
