"""The run index: the one read model of what a run's files hold.

It is also the resume state: admission (jobs/pipeline/admission.py), the plans'
settings check, progress, continuation, report, forecast, finalize and export all
ask this module which keys are done, failed (open: failed and not done since) or
rejected, and which row is each key's latest version. It reads the parts' sidecars
(jobs/io/part_summary.py) in parallel, not the parts: a few KB per part instead of
every Parquet footer in turn. A part without a usable sidecar (a crash between part and
sidecar, an unreadable or stale one, a part written before sidecars existed) is read
once and its sidecar written back; a damaged part is quarantined by that read (its rows
are not done); a sidecar whose part is gone is never looked at, since the part listing
drives everything.

``refresh()`` is incremental: it reads only parts it has not seen, so the progress
thread's scans and the end of a session cost what was written since the last one. The
first one starts from the run's newest usable compact object (jobs/io/index_compact.py,
written by the lease holder at the end of each session) and reads only the sidecars of
parts it does not cover: an open costs O(sessions) reads, not O(parts).

Memory: one entry per key, in numpy arrays sorted by key digest (8-byte blake2b,
jobs/io/digests.py): digest, version, created_ms, part, row, finish code, tokens,
prompt digest, settings code: 43 bytes per key (430 MB at 10M keys), no Python
string per key; an open merges what it collected every MERGE_ROWS rows, so its
transient memory stays bounded. Two different keys with the same digest (probability
~n^2/2^65, 3e-6 at 10M keys) are one key here: the rule below picks one row for both,
and both count as done (admission reads the same digests from this index).

The latest version of a key (THE tie-break rule, ``LATEST_ORDER``, compared by
``later``): the highest version; equal versions (which the writer never produces) the
later created_at, then the part whose path sorts last, then the later row in that part.
An open, a refresh against the rows held, ``latest_rows`` on a frame and the export
journal's watermark (jobs/analysis/export_journal.py) all apply it from here.

Who sets what: only this class sets its fields. A compact object is decoded into an
``IndexState`` (jobs/io/index_state.py) that ``apply`` takes as the index's own, and
``state()`` is what the compact writer encodes.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import posixpath
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from jobs.io import index_compact, part_summary
from jobs.io.digests import sorted_contains
from jobs.io.index_state import COLUMNS, IndexState, PartRecord, empty_latest
from jobs.io.run_store import RunStore
from jobs.io.samples import row_key
from jobs.io.schema import DATA, KINDS
from jobs.io.storage import list_files, read_bytes, write_bytes_atomic

logger = logging.getLogger("raygen")
OPEN_THREADS = 32   # sidecar reads in flight: each S3 GET is ~30 ms of waiting
# The tie-break rule, most significant first (see the docstring); a frame of rows in
# part path and row order has the last two as its order.
LATEST_ORDER = ("version", "created_at", "part path", "row")
# The per-key arrays (index_state.COLUMNS) that hold them; "part" ids follow their
# paths' order among rows read in one refresh (the listing is sorted), not across them.
LATEST_ARRAYS = ("version", "created_ms", "part", "row")
# Rows collected from sidecars before they are merged into the per-key arrays: bounds
# the open's extra memory (~100 B per collected row) whatever the run's size.
MERGE_ROWS = 1 << 20
VERSION_MIX = np.uint64(0x9E3779B97F4A7C15)   # odd: spreads versions over all 64 bits


# --- row ids ------------------------------------------------------------------------

def row_ids(kind: str, table: pa.Table) -> list[str]:
    """The ids a part's name is hashed from: key#version, key@failed_at, source:line."""
    if kind != "rejects":  # the key as the row's identity: key NUL sample for samples >= 1
        samples = (table.column("sample").to_pylist() if "sample" in table.column_names
                   else [None] * table.num_rows)
        keys = [row_key(k, s) for k, s in zip(table.column("key").to_pylist(), samples)]
    if kind == "data":
        return [f"{k}#{v}" for k, v in zip(keys, table.column("version").to_pylist())]
    if kind == "failures":
        return [f"{k}@{t}" for k, t in zip(keys, table.column("failed_at").to_pylist())]
    return [f"{s}:{n}" for s, n in zip(table.column("source").to_pylist(),
                                       table.column("line").to_pylist())]


def version_digests(key_digests: np.ndarray, versions: np.ndarray) -> np.ndarray:
    """One uint64 per (key, version): a data row's identity as a digest."""
    return key_digests ^ (versions.astype(np.uint64) * VERSION_MIX)


def later(a: Sequence, b: Sequence) -> np.ndarray:
    """LATEST_ORDER's comparison, row by row: is a's row later than b's? ``a`` and ``b``
    hold aligned columns of the rule, most significant first (a prefix of it compares
    by that prefix: equal is not later). A column may be a function of the positions
    still tied, so a costly one (part paths) is built only for exact ties."""
    n = len(a[0])
    wins, tied = np.zeros(n, bool), np.arange(n)
    for x, y in zip(a, b):
        if not len(tied):
            break
        x = x(tied) if callable(x) else np.asarray(x)[tied]
        y = y(tied) if callable(y) else np.asarray(y)[tied]
        wins[tied[x > y]] = True
        tied = tied[x == y]
    return wins


def latest_rows(df: pd.DataFrame) -> pd.DataFrame:
    """LATEST_ORDER on a frame of rows (key, version, created_at if present), in part
    path and row order: one row per key, its latest version."""
    if not {"key", "version"} <= set(df.columns) or not df["key"].duplicated().any():
        return df
    order = ["key"] + [c for c in LATEST_ORDER if c in df.columns]
    return df.sort_values(order, kind="stable").drop_duplicates("key", keep="last")


# --- the index ----------------------------------------------------------------------

class RunIndex:
    """What a run holds; ``RunIndex.open(store)`` or ``RunIndex(store).refresh()``
    (store None: an index of no run, holding what ``apply`` gives it)."""

    def __init__(self, store: Optional[RunStore], threads: int = OPEN_THREADS):
        self.store, self.threads = store, threads
        self.latest = empty_latest()
        self.failed = np.empty(0, np.uint64)       # every key that failed, sorted
        self.reject_ids: set[str] = set()
        self.first_budgets: collections.Counter = collections.Counter()  # (hash, budget)
        self.part_paths: list[str] = []             # data parts; index = "part" column
        self.finishes: list[Optional[str]] = []     # finish code -> finish_reason
        self.settings: list[Optional[str]] = []     # settings code -> settings_hash
        self.data_rows = 0                           # rows of every version
        self.seen: set[str] = set()                  # paths of the parts read whole
        self.checksums: dict[str, str] = {}          # part path -> sha256 its sidecar holds
        self.sizes: dict[str, int] = {}              # part path -> bytes, as listed
        self.bytes_written, self.last_write_ts, self.quarantined = 0, 0.0, 0
        # (metric, label) of outcomes in parts first seen since the caller last cleared
        # it: the job's failure/retry/reject counters come from durable rows.
        self.events: list[tuple[str, str]] = []
        self.reads: collections.Counter = collections.Counter()  # "sidecar" / "part"
        # Keys whose latest row a newer version replaced since this index was made, and
        # the completion tokens that added (a continuation's; a regeneration's may be <0).
        self.replaced_keys, self.replaced_tokens = 0, 0
        self.compact_covered = 0   # parts the last compact object read or written covers
        self.compact_number: Optional[int] = None   # that object's n, if its stats are usable
        self.compact_data_digest = ""
        self._compact_tried = False
        self._held_stats: Optional[tuple] = None   # latest_stats(hold=True)'s read

    @classmethod
    def open(cls, store: RunStore) -> "RunIndex":
        index = cls(store)
        index.refresh()
        return index

    # --- reading ---

    def refresh(self) -> int:
        """Read the parts not seen yet (in parallel); returns how many there were. The
        first refresh starts from the newest usable compact object
        (jobs/io/index_compact.py) and reads only the sidecars of parts it does not cover."""
        listing = [(kind, info) for kind in KINDS
                   for info in sorted(list_files(self.store.loc(kind), ".parquet"),
                                      key=lambda i: i.path)]
        quarantined, parts_read = self.store.quarantined(), self.reads["part"]
        # A part written again under the name of a quarantined one (its rows regenerated
        # and cut as before) may meet what was recorded of the damaged one: its sidecar,
        # left in index/ until the new part's own replaces it, and a compact object's
        # entry when the sizes agree. Those records are believed only if their sha256 is
        # the new part's bytes' (one part read each; quarantines are rare).
        suspect = frozenset(self.store.loc(*name.split("/")).path for name in quarantined)
        if not self._compact_tried and not self.seen:
            self._compact_tried = True
            listed = {info.path: info for _, info in listing}
            found = index_compact.load(self.store, self.key_salt, listed, suspect)
            if found is not None:
                self.apply(found.state, listed)
                self.reads["compact"] += 1
                self.note_compact(found.number, found.data_digest, len(found.state.parts))
        new = [(kind, info) for kind, info in listing if info.path not in self.seen]
        if new:
            sidecars = {info.path for kind in KINDS for info in list_files(
                self.store.loc(part_summary.INDEX, kind), part_summary.SUFFIX)}
            rows: dict[str, list[np.ndarray]] = collections.defaultdict(list)
            failed: list[np.ndarray] = []
            collected = 0
            with ThreadPoolExecutor(max_workers=min(self.threads, len(new))) as pool:
                # in order, each summary turned into arrays and dropped as it arrives
                for (kind, info), (summary, source) in zip(new, _in_order(
                        pool, lambda ki: self._summary(*ki, sidecars, suspect), new,
                        4 * self.threads)):
                    self.reads[source] += 1
                    if summary is None:  # quarantined or gone: its rows are not done, and
                        continue         # a part written again under its name is new
                    self._note_part(info.path, info.size, info.mtime)
                    sha256 = part_summary.checksum(summary)
                    if sha256:
                        self.checksums[info.path] = sha256
                    for metric, labels in part_summary.details(summary)["events"].items():
                        self.events += [(metric, label) for label, n in sorted(labels.items())
                                        for _ in range(n)]
                    if kind == "data":
                        self._add_part(info.path, summary, rows)
                        collected += summary.num_rows
                        if collected >= MERGE_ROWS:
                            self._merge_rows(rows)
                            collected = 0
                    elif kind == "failures":
                        failed.append(summary.column("digest").to_numpy())
                    else:
                        self.reject_ids.update(summary.column("reject_id").to_pylist())
            if failed:
                self.failed = np.union1d(self.failed, np.concatenate(failed))
            self._merge_rows(rows)
        # a part read here (no usable sidecar) may have been quarantined by that read
        self.quarantined = len(self.store.quarantined() if self.reads["part"] > parts_read
                               else quarantined)
        return len(new)

    def _summary(self, kind: str, info, sidecars: set[str], suspect: frozenset[str] = frozenset()
                 ) -> tuple[Optional[pa.Table], str]:
        """(the part's summary or None when the part is damaged/gone, where it came from).
        ``suspect``: parts whose sidecar may be a quarantined namesake's (checked)."""
        name = posixpath.basename(info.path)
        loc = self.store.sidecar_loc(kind, name)
        if loc.path in sidecars:
            data = read_bytes(loc)
            if data is not None:
                try:
                    summary = part_summary.decode(data, kind, info.size, self.key_salt)
                    if info.path not in suspect or self.store.holds_bytes(
                            info.path, part_summary.checksum(summary)):
                        return summary, "sidecar"
                    logger.warning("sidecar %s describes the quarantined part of that name, "
                                   "not the one written since: rebuilding it from the part",
                                   loc.uri)
                except part_summary.BadSidecar as exc:
                    logger.warning("sidecar %s %s: rebuilding it from the part", loc.uri, exc)
        table = self.store.read_part(info.path, part_summary.SOURCE_COLUMNS[kind])
        if not table.num_rows:  # quarantined by this read, or by another reader meanwhile
            return None, "part"
        # Rebuilt: the part as it is now is what later reads are checked against.
        sha256 = hashlib.sha256(self.store.part_bytes(info.path)).hexdigest()
        summary = part_summary.summarize(kind, table, info.size, sha256, self.key_salt)
        try:
            write_bytes_atomic(loc, part_summary.encode(summary))
        except OSError as exc:  # a read-only reader still gets its answer
            logger.warning("cannot write sidecar %s (%s): rebuilt again next time", loc.uri, exc)
        return summary, "part"

    def _note_part(self, path: str, size: Optional[int], mtime) -> None:
        self.seen.add(path)
        self.sizes[path] = size or 0
        self.bytes_written += size or 0
        if mtime is not None:
            self.last_write_ts = max(self.last_write_ts, mtime.timestamp())

    # --- the state as one value (jobs/io/index_state.py) ---

    def apply(self, state: IndexState, listing: Optional[Mapping[str, Any]] = None) -> None:
        """Take ``state`` as this fresh index's own (nothing read yet): a compact
        object's, decoded. ``listing``: part path -> FileInfo as listed now (each part's
        size and time; a part not in it counts with its recorded size)."""
        self.latest = state.latest
        self.failed, self.reject_ids = state.failed, set(state.reject_ids)
        self.part_paths = list(state.data_parts)
        self.finishes, self.settings = list(state.finishes), list(state.settings)
        self.first_budgets.update(state.first_budgets)
        self.data_rows = state.data_rows
        for path, size, sha256 in state.parts:
            info = (listing or {}).get(path)
            self._note_part(path, info.size if info is not None else size,
                            info.mtime if info is not None else None)
            if sha256:
                self.checksums[path] = sha256

    def state(self) -> IndexState:
        """What this index holds, as one value (its arrays shared, not copied)."""
        return IndexState(
            latest=self.latest, failed=self.failed, reject_ids=self.reject_ids,
            parts=[PartRecord(path, self.sizes[path], self.checksums.get(path, ""))
                   for path in sorted(self.seen)],
            data_parts=self.part_paths, finishes=self.finishes, settings=self.settings,
            first_budgets=dict(self.first_budgets), data_rows=self.data_rows)

    def note_compact(self, number: Optional[int], data_digest: str, covered: int) -> None:
        """A compact object was read or written for this index: its number (None when
        its stats object is not usable), the digest of its data parts, how many parts
        it covers (jobs/io/index_compact.py)."""
        self.compact_number, self.compact_data_digest = number, data_digest
        self.compact_covered = covered

    def _codes(self, column: pa.ChunkedArray, vocab: list) -> np.ndarray:
        """A dictionary column as codes into ``vocab`` (extended with new values)."""
        arr = column.combine_chunks()
        values = arr.dictionary.to_pylist() + [None]
        for v in values:
            if v not in vocab:
                vocab.append(v)
        remap = np.array([vocab.index(v) for v in values], np.uint16)
        indices = arr.indices.fill_null(len(values) - 1) if arr.null_count else arr.indices
        return remap[indices.to_numpy()]

    def _merge_rows(self, rows: dict[str, list[np.ndarray]]) -> None:
        """Merge the collected rows and empty ``rows`` (column by column, so the lists
        and their concatenation never coexist whole)."""
        if rows["digest"]:
            self._merge({name: np.concatenate(rows.pop(name)).astype(dtype, copy=False)
                         for name, dtype in COLUMNS.items()})

    def _add_part(self, path: str, s: pa.Table, rows: dict[str, list[np.ndarray]]) -> None:
        """Append a data part's rows to ``rows`` (per-key columns, as COLUMNS)."""
        pid, n = len(self.part_paths), s.num_rows
        self.part_paths.append(path)
        self.data_rows += n
        for h, b, count in part_summary.details(s)["budgets"]:
            self.first_budgets[(h, b)] += count
        for name in ("digest", "version", "created_ms", "tokens", "prompt"):
            rows[name].append(s.column(name).to_numpy())
        rows["part"].append(np.full(n, pid, np.uint32))
        rows["row"].append(np.arange(n, dtype=np.uint32))
        rows["finish"].append(self._codes(s.column("finish"), self.finishes))
        rows["settings"].append(self._codes(s.column("settings"), self.settings))

    def _merge(self, new: dict[str, np.ndarray]) -> None:
        """Fold rows into the per-key arrays, keeping each key's latest (LATEST_ORDER).
        New rows' part ids follow their paths' order, so within them the lexsort is the
        rule; against a held row the rare exact tie compares the part paths."""
        order = np.lexsort([new[k] for k in reversed(LATEST_ARRAYS)] + [new["digest"]])
        for k in COLUMNS:  # column by column: one temporary copy at a time
            new[k] = new[k][order]
        del order
        d = new["digest"]
        last = np.ones(len(d), bool)
        last[:-1] = d[1:] != d[:-1]
        for k in COLUMNS:
            new[k] = new[k][last]
        old = self.latest
        found, pos = sorted_contains(old["digest"], new["digest"])
        if found.any():
            i_new, i_old = np.flatnonzero(found), pos[found]
            wins = self._newer(new, i_new, i_old)
            self.replaced_keys += int(wins.sum())
            self.replaced_tokens += int(new["tokens"][i_new[wins]].sum(dtype=np.int64)
                                        - old["tokens"][i_old[wins]].sum(dtype=np.int64))
            for k in COLUMNS:
                old[k][i_old[wins]] = new[k][i_new[wins]]
        add = ~found
        at = np.searchsorted(old["digest"], new["digest"][add])
        for k in COLUMNS:
            old[k] = np.insert(old[k], at, new[k][add]) if len(old[k]) else new[k][add]

    def _newer(self, new: dict[str, np.ndarray], i_new: np.ndarray,
               i_old: np.ndarray) -> np.ndarray:
        """later() of new rows i_new against held rows i_old (part ids compared by path)."""
        def rule(rows: dict[str, np.ndarray], at: np.ndarray) -> list:
            paths = self.part_paths
            return [rows["version"][at], rows["created_ms"][at],
                    lambda tied: np.array([paths[p] for p in rows["part"][at[tied]]], object),
                    rows["row"][at]]
        return later(rule(new, i_new), rule(self.latest, i_old))

    # --- answers ---

    @property
    def done(self) -> np.ndarray:
        """Sorted digests of the keys with a row in data/."""
        return self.latest["digest"]

    @property
    def key_salt(self) -> bytes:
        """The salt of the run's key digests (jobs/io/digests.py; b"" for none)."""
        return self.store.key_salt if self.store is not None else b""

    @property
    def done_prompts(self) -> np.ndarray:
        """Prompt digests of the done keys' latest rows, aligned with ``done`` (0: the
        row predates prompt hashes)."""
        return self.latest["prompt"]

    def open_failed(self) -> np.ndarray:
        """Sorted digests of keys that failed and have no row in data/ since."""
        return self.failed[~sorted_contains(self.done, self.failed)[0]]

    def code_of_finish(self, reason: str) -> int:
        return self.finishes.index(reason) if reason in self.finishes else -1

    @property
    def truncated(self) -> int:
        return int((self.latest["finish"] == self.code_of_finish("length")).sum())

    @property
    def output_tokens(self) -> int:
        return int(self.latest["tokens"].sum(dtype=np.int64))

    def finish_counts(self) -> dict[Optional[str], int]:
        """finish_reason -> keys whose latest version ended so."""
        counts = np.bincount(self.latest["finish"], minlength=len(self.finishes))
        return {self.finishes[c]: int(n) for c, n in enumerate(counts) if n}

    def settings_of(self, rows: np.ndarray) -> list[Optional[str]]:
        return [self.settings[c] for c in self.latest["settings"][rows]]

    def by_part(self, positions: Optional[np.ndarray] = None
                ) -> Iterator[tuple[str, np.ndarray]]:
        """(data part path, positions in the per-key arrays of the rows it holds, in row
        order) per data part holding any of ``positions`` (default: every key's latest
        row), in the order the index first read the parts."""
        part, row = self.latest["part"], self.latest["row"]
        if positions is None:
            positions = np.lexsort((row, part))
        else:
            positions = positions[np.lexsort((row[positions], part[positions]))]
        cuts = np.flatnonzero(np.diff(part[positions])) + 1
        for group in np.split(positions, cuts):
            if len(group):
                yield self.part_paths[part[group[0]]], group

    def winners_by_part(self) -> dict[str, np.ndarray]:
        """data part path -> positions of its rows that are a key's latest, ascending,
        for the parts holding any (in path order)."""
        groups = {path: self.latest["row"][at] for path, at in self.by_part()}
        return dict(sorted(groups.items()))

    def latest_stats(self, columns: list[str], hold: bool = False
                     ) -> Iterable[tuple[str, np.ndarray, pa.Table]]:
        """(part path, its winning rows, their ``columns``): ``latest_stats_by_part``.
        ``hold``: read every part_summary.SERVED column and keep them for the next call
        while the winners are the same (the session's end: its report, then the compact
        stats object from that one read); the next call takes them."""
        state = (self.data_rows, len(self.seen), self.quarantined, self.compact_number)
        held, self._held_stats = self._held_stats, None
        if held is not None and held[0] == state:
            return [(path, rows, table.select(columns)) for path, rows, table in held[1]]
        if not hold:
            return latest_stats_by_part(self.store, self, columns)
        parts = list(latest_stats_by_part(self.store, self, part_summary.SERVED))
        self._held_stats = (state, parts)
        return [(path, rows, table.select(columns)) for path, rows, table in parts]

    def take_events(self) -> list[tuple[str, str]]:
        events, self.events = self.events, []
        return events

    @property
    def nbytes(self) -> int:
        """Bytes of the per-key arrays (the index's size grows with these)."""
        return int(sum(a.nbytes for a in self.latest.values()) + self.failed.nbytes)


def _in_order(pool: ThreadPoolExecutor, fn, items: list, window: int):
    """fn(item) for each item, run in the pool, yielded in order with at most ``window``
    in flight: results wait for the consumer in bounded numbers."""
    pending: collections.deque = collections.deque()
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def read_latest(store: RunStore, index: RunIndex, columns: Optional[list[str]] = None,
                verify: bool = False) -> Iterable[tuple[str, pa.Table, int]]:
    """(part path, ``columns`` of its keys' latest rows, how many it should hold) per
    data part, streaming. ``verify``: read each part whole and check its bytes against
    the sha256 its sidecar recorded (what the dataset is made of: finalize, export). A
    part found damaged is quarantined and yields no rows: the caller sees the shortfall."""
    for path, rows in index.winners_by_part().items():
        table = store.read_part(path, columns, index.checksums.get(path) if verify else None)
        if table.num_rows:  # else: quarantined since the index read its sidecar: not done
            table = table.take(pa.array(rows))
        yield path, table, len(rows)


def read_latest_stats(store: RunStore, index: RunIndex,
                      columns: list[str]) -> Iterable[pa.Table]:
    """``columns`` (data columns, at most part_summary.SERVED) of every key's latest row,
    a table per data part: ``latest_stats_by_part``."""
    for _, _, table in latest_stats_by_part(store, index, columns):
        yield table


def latest_stats_by_part(store: RunStore, index: RunIndex, columns: list[str]
                         ) -> Iterable[tuple[str, np.ndarray, pa.Table]]:
    """(part path, its rows that are a key's latest, their ``columns``) per data part.
    The parts the index's compact object covers answer from its stats object (one read,
    jobs/io/index_compact.py); the others from their format-4 sidecars, read in
    parallel: no data part is read. A part whose sidecar is older (format 1-3), missing
    or not its part's any more is read instead (those columns only); one quarantined
    meanwhile yields no rows, as in ``read_latest``."""
    winners = list(index.winners_by_part().items())
    compact = index_compact.load_stats(index) if winners else None
    rest = winners
    if compact is not None:
        found = [(path, rows, compact.positions(path, rows)) for path, rows in winners]
        cached = [(path, rows, at) for path, rows, at in found if at is not None]
        rest = [(path, rows) for path, rows, at in found if at is None]
        if cached:
            table = compact.columns(np.concatenate([at for _, _, at in cached]), columns)
            start = 0
            for path, rows, _ in cached:
                index.reads["report_compact"] += 1
                yield path, rows, table.slice(start, len(rows))
                start += len(rows)

    def one(item: tuple[str, np.ndarray]) -> tuple[pa.Table, str]:
        path, rows = item
        data = read_bytes(store.sidecar_loc("data", posixpath.basename(path)))
        if data is not None:
            try:
                summary = part_summary.decode(data, "data", index.sizes.get(path, -1),
                                              index.key_salt)
            except part_summary.BadSidecar:
                summary = None
            if summary is not None and part_summary.has_stats(summary):
                held = part_summary.served(summary, columns)
                table = part_summary.stats(summary, pa.array(rows), held)
                if len(held) == len(columns):
                    return table, "sidecar"
                # a format-4 sidecar: the statistics added since come from the part
                rest = [c for c in columns if c not in held]
                read = store.read_part(path, rest)
                if not read.num_rows:  # quarantined meanwhile: no rows, as below
                    return read, "part"
                read = read.take(pa.array(rows))
                return pa.table({c: (table if c in held else read).column(c) for c in columns},
                                schema=pa.schema([DATA.field(c) for c in columns])), "sidecar+part"
        table = store.read_part(path, columns)
        return (table.take(pa.array(rows)) if table.num_rows else table), "part"

    if not rest:
        return
    with ThreadPoolExecutor(max_workers=min(index.threads, len(rest))) as pool:
        for (path, rows), (table, source) in zip(rest, _in_order(pool, one, rest,
                                                                 4 * index.threads)):
            index.reads[f"report_{source}"] += 1
            yield path, rows, table


def describe(index: RunIndex) -> dict[str, Any]:
    """The index's counts (for logs and the benchmark)."""
    return {"keys": len(index.done), "data_rows": index.data_rows,
            "open_failed": len(index.open_failed()), "rejected": len(index.reject_ids),
            "parts": len(index.seen), "reads": dict(index.reads), "bytes": index.nbytes}
