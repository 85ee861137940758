"""Admission: the driver's one pass over the input, deciding which input rows this run
still has to generate.

One streaming pass by the driver, before any engine work, decides every row's fate
as a pure function of the input files and the run's own files, so whatever Ray
re-executes later (read, validate, admit, generate or write tasks) a row gets the same
verdict the second time:

- invalid rows and later occurrences of a key are rejects, final here: the driver
  writes the new ones to rejects/ (identified by content, ``reject_id``, never by line);
- of the valid rows, the FIRST occurrence of each key in input order (``job.input``
  file order, then line) is the one that counts (the keys met so far:
  jobs/pipeline/seen_keys.py); it goes on unless data/ already holds its key, or
  failures/ does (then only ``--retry-failed`` sends it);
- the result is an ``AdmissionTable`` (jobs/pipeline/admission_table.py: sorted 8-byte
  key digests + the ordinal of the chosen occurrence), put in the object store once;
  the Ray Data admit stage (jobs/pipeline/admit_stage.py) is a stateless filter over it;
- on the way each input file is fingerprinted (jobs/pipeline/input_fingerprints.py:
  <run>/inputs.json, and what changed since the last session).

With ``job.samples_per_prompt`` n > 1 the pass itself is the same (keys, duplicates and
rejects are properties of input rows, not samples); at its end each valid key is
expanded into its n identities (jobs/io/samples.py: (key, sample) digests), each decided
alone against the run (done, open failure), and the table holds the identities to send.

Digests are jobs/io/digests.py's with the run's salt (the run index holds the same).
Two different keys share a digest with probability ~n^2/2^65 (3e-6 at 10M keys); the
later one would then be rejected as a duplicate naming the other's line, never lost
silently.
"""

from __future__ import annotations

import collections
import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import pyarrow as pa

from jobs.io.digests import digests_of, key_digest, sorted_contains
from jobs.io.samples import sample_digests
from jobs.io.run_index import RunIndex
from jobs.io.schema import REJECTS
from jobs.io.sources import MAX_LINE_BYTES, ORDINAL_SHIFT, iter_rows, ordinal_of, place_of_ordinal
from jobs.io.storage import Location, file_info
from jobs.pipeline import input_fingerprints
from jobs.pipeline.admission_table import AdmissionTable
from jobs.pipeline.rows import now
from jobs.pipeline.seen_keys import SeenKeys
from jobs.pipeline.validate import RowError, parse_row

logger = logging.getLogger("raygen")
CHUNK_ROWS = 16384          # rows checked against the seen keys at a time
REJECT_PART_ROWS = 2000     # rejects per part file the driver writes
EXAMPLES = 5
RAW_KEPT = 2000             # characters of a rejected line kept in rejects/


@dataclass
class Admission:
    """The pass's verdict, and what it saw on the way."""

    table: AdmissionTable
    total: int                      # input rows read (progress total)
    valid_keys: int                 # distinct valid keys in the input
    rejects: int                    # invalid rows + later duplicates in the input
    new_rejects: int                # of which written to rejects/ by this pass
    fingerprints: list[dict[str, Any]]
    edited: int = 0                 # done keys whose prompt changed under the same id
    edited_examples: list[str] = field(default_factory=list)
    removed: int = 0                # done keys no longer in the input
    seen_bytes: int = 0             # peak size of the pass's key arrays
    # With samples > 1, held, failed_open and removed count (key, sample) identities.
    held: int = 0                   # distinct input keys the run already holds (done)
    failed_open: int = 0            # distinct input keys with an open failure, not done
    # With keep_keys: every valid distinct key of the input (sorted digests, the ordinal
    # of its first occurrence, its occurrences) and every reject id, what a later
    # session reuses (jobs/pipeline/admission_cache.py); None when not kept.
    input_keys: Optional[tuple[np.ndarray, np.ndarray, np.ndarray]] = None
    reject_ids: Optional[list[str]] = None
    lines_read: int = 0             # input lines this pass parsed (a reused one: its tail)
    samples: int = 1                # job.samples_per_prompt the table was made for


@dataclass
class Recorded:
    """What an earlier pass found in the input (jobs/pipeline/admission_cache.py), and
    what this pass reads of it: per input file "same" (not read: its recorded rows and
    fingerprint stand), "tail" (grown: read whole, only lines after ``lines`` parsed,
    its first ``size`` bytes must still hash to ``sha256``) or "new" (read whole)."""

    digests: np.ndarray             # every valid distinct key, sorted
    ordinals: np.ndarray            # its first occurrence
    counts: np.ndarray              # its occurrences (ranks later duplicates' reject ids)
    files: list[dict[str, Any]]     # the recorded fingerprints, with newlines / ends_newline
    reads: list[str]                # per input file: "same", "tail" or "new"
    reject_ids: list[str]
    rejects: int
    edited: int
    edited_examples: list[str]


class PrefixChanged(Exception):
    """A grown input's old bytes changed: the recorded pass does not hold (run a pass)."""


def reject_record(source: str, line: int, raw: str, reason: str, reject_id: str,
                  key: Optional[str] = None, row_id: Optional[str] = None) -> dict[str, Any]:
    return {"source": source, "line": line, "key": key, "id": row_id, "reason": reason,
            "raw": raw[:RAW_KEPT], "reject_id": reject_id, "rejected_at": now()}


def _content_id(prefix: str, text: str, rank: int) -> str:
    return f"{prefix}:{hashlib.sha256(text.encode()).hexdigest()[:24]}#{rank}"


class _Pass:
    """State of one admission pass over the inputs."""

    def __init__(self, index: RunIndex, uris: list[str], write: Callable[[list], None]):
        self.uris, self.write = uris, write
        self.done, self.done_prompts = index.done, index.done_prompts
        self.failed, self.reject_ids = index.open_failed(), index.reject_ids
        self.salt = index.key_salt
        self.seen = SeenKeys()  # keys the run does not hold yet
        # Keys the run holds are tracked in place, aligned with self.done: their first
        # ordinal (-1: not met yet) and count, 12 bytes a key instead of SeenKeys' 20
        # and its merges; at a resume of 10M held keys that is most of the pass's memory.
        self.done_first = np.full(len(self.done), -1, np.int64)
        self.done_count = np.zeros(len(self.done), np.uint32)
        self.chunk: list[tuple[int, str, Optional[str], str, int, str]] = []
        self.invalid_ranks: collections.Counter = collections.Counter()
        self.rejects, self.new_rejects, self.pending = 0, 0, []
        self.edited, self.edited_examples = 0, []
        self.kept_reject_ids: Optional[list[str]] = None  # every reject's id, when kept

    def reject(self, record: dict[str, Any]) -> None:
        self.rejects += 1
        if self.kept_reject_ids is not None:
            self.kept_reject_ids.append(record["reject_id"])
        if record["reject_id"] not in self.reject_ids:
            self.new_rejects += 1
            self.pending.append(record)
            if len(self.pending) >= REJECT_PART_ROWS:
                self.write_pending()

    def write_pending(self) -> None:
        if self.pending:
            self.write(self.pending)
            self.pending = []

    def row(self, source: str, line: int, ordinal: int, raw: str,
            problem: Optional[str] = None) -> None:
        try:
            parsed = parse_row(raw, problem)
        except RowError as exc:
            rid = hashlib.sha256(raw.encode()).hexdigest()[:24]
            self.invalid_ranks[rid] += 1  # identical bad lines: each its own reject
            self.reject(reject_record(source, line, raw, str(exc),
                                      f"raw:{rid}#{self.invalid_ranks[rid]}"))
            return
        # raw kept only as far as a reject stores it: a chunk of long prompts stays small
        self.chunk.append((ordinal, parsed["key"], parsed["id"], parsed["prompt_hash"],
                           line, raw[:RAW_KEPT]))
        if len(self.chunk) >= CHUNK_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self.chunk:
            return
        ordinals = np.fromiter((r[0] for r in self.chunk), np.int64, len(self.chunk))
        digests = digests_of((r[1] for r in self.chunk), self.salt)
        held, pos = sorted_contains(self.done, digests)
        met = self.done_first[pos] >= 0 if len(self.done_first) else np.zeros(len(pos), bool)
        known = np.where(held, met, self.seen.contains(digests))
        _, first = np.unique(digests, return_index=True)  # first index of each digest
        is_new = np.zeros(len(digests), bool)
        is_new[first] = True
        is_new &= ~known
        self._check_edits(np.flatnonzero(is_new & held), pos)
        new_held = is_new & held
        self.done_first[pos[new_held]] = ordinals[new_held]
        self.done_count[pos[new_held]] = 1
        self.seen.add_new(digests[is_new & ~held], ordinals[is_new & ~held])
        for i in np.flatnonzero(~is_new):  # duplicates are rare: a loop is fine
            ordinal, key, row_id, _, line, raw = self.chunk[i]
            if held[i]:
                self.done_count[pos[i]] += 1
                rank, first_ordinal = int(self.done_count[pos[i]]), int(self.done_first[pos[i]])
            else:
                rank, first_ordinal = self.seen.bump(int(digests[i]))
            self.reject(reject_record(
                self.uris[ordinal >> ORDINAL_SHIFT], line, raw,
                f"duplicate id {key!r}: first seen at "
                f"{place_of_ordinal(self.uris, first_ordinal)}",
                _content_id("dup", key, rank), key, row_id))
        self.chunk = []

    @property
    def nbytes(self) -> int:
        return self.seen.nbytes + self.done_first.nbytes + self.done_count.nbytes

    def held_met(self) -> int:
        """Keys the run holds that the input has (so far)."""
        return int((self.done_first >= 0).sum())

    def seed(self, rec: Recorded) -> None:
        """Start where the recorded pass ended: its keys (held ones in place), counts,
        rejects and the ranks of identical bad lines."""
        held, pos = sorted_contains(self.done, rec.digests)
        self.done_first[pos[held]] = rec.ordinals[held]
        self.done_count[pos[held]] = rec.counts[held]
        self.seen.add_counted(rec.digests[~held], rec.ordinals[~held], rec.counts[~held])
        self.rejects, self.edited = rec.rejects, rec.edited
        self.edited_examples = list(rec.edited_examples)
        if self.kept_reject_ids is not None:
            self.kept_reject_ids.extend(rec.reject_ids)
        for rid in rec.reject_ids:
            if rid.startswith("raw:"):
                content, _, rank = rid[4:].rpartition("#")
                self.invalid_ranks[content] = max(self.invalid_ranks[content], int(rank))

    def table(self, retry_failed: bool, keep_keys: bool = False, samples: int = 1
              ) -> tuple[AdmissionTable, int, int,
                         Optional[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
        """(what to generate, distinct keys met that the run does not hold, of which with
        an open failure, and with ``keep_keys`` every valid key met: sorted digests,
        first ordinals, counts), once the pass is over; frees the pass's arrays first.
        With ``samples`` > 1 see :meth:`sample_table`."""
        digests, ordinals, counts = self.seen.merged()  # none of them held by the run
        kept = None
        if keep_keys or samples > 1:
            met = self.done_first >= 0
            all_d = np.concatenate([digests, self.done[met]])
            all_o = np.concatenate([ordinals, self.done_first[met]])
            all_c = np.concatenate([counts, self.done_count[met]])
            order = np.argsort(all_d, kind="stable")
            kept = (all_d[order], all_o[order], all_c[order])
        self.seen = SeenKeys()
        self.done_first, self.done_count = self.done_first[:0], self.done_count[:0]
        if samples > 1:
            table, self.held_ids, failed_open = _samples_to_generate(
                kept[0], kept[1], self.done, self.failed, retry_failed, samples, self.salt)
            return table, len(digests), failed_open, kept if keep_keys else None
        table, failed_open = _to_generate(digests, ordinals, self.failed, retry_failed,
                                          self.salt)
        return table, len(digests), failed_open, kept

    def _check_edits(self, rows: np.ndarray, pos: np.ndarray) -> None:
        """rows: chunk rows meeting a held key for the first time; pos: their places in
        self.done."""
        for i in rows:
            stored = self.done_prompts[pos[i]]
            _, key, _, prompt_hash, _, _ = self.chunk[i]
            if stored and stored != key_digest(prompt_hash, self.salt):
                self.edited += 1
                if len(self.edited_examples) < EXAMPLES:
                    self.edited_examples.append(key)


def admit_inputs(inputs: list[Location], index: RunIndex, retry_failed: bool,
                 write_rejects: Callable[[list[dict[str, Any]]], None],
                 limit: Optional[int] = None, max_line_bytes: int = MAX_LINE_BYTES,
                 keep_keys: bool = False, recorded: Optional[Recorded] = None,
                 samples: int = 1) -> Admission:
    """The driver's one pass: validate, fingerprint, dedupe and decide every row against
    what ``index`` (the run's files) already holds. ``keep_keys``: also return the
    input's valid keys and reject ids (Admission.input_keys / reject_ids). ``recorded``:
    go on from an earlier pass over the same input (unchanged files are not read, a
    grown one only parsed past its old lines; PrefixChanged if its old bytes changed).
    ``samples``: job.samples_per_prompt (each valid key decided as that many identities).

    New rejects go to ``write_rejects`` in parts of at most REJECT_PART_ROWS as the
    pass finds them (each line cut to RAW_KEPT characters)."""
    uris = [loc.uri for loc in inputs]
    state = _Pass(index, uris, write_rejects)
    if keep_keys:
        state.kept_reject_ids = []
    if recorded is not None:
        state.seed(recorded)
    total, prints, parsed = 0, [], 0
    for file_no, loc in enumerate(inputs):
        read = recorded.reads[file_no] if recorded is not None else "new"
        if read == "same":
            prints.append(recorded.files[file_no])
            total += recorded.files[file_no]["rows"]
            continue
        old = recorded.files[file_no] if read == "tail" else None
        hasher = input_fingerprints.Fingerprint(old["size"] if old else None)
        rows, complete = old["rows"] if old else 0, True
        skip = old["newlines"] if old else 0
        for line, raw, problem in iter_rows(loc, hasher, max_line_bytes, skip):
            rows += 1
            parsed += 1
            state.row(loc.uri, line, ordinal_of(file_no, line), raw, problem)
            if limit is not None and rows >= limit:
                complete = False
                break
        if old and hasher.prefix != old["sha256"]:
            raise PrefixChanged(f"{loc.uri}: its first {old['size']:,} bytes changed since "
                                f"the recorded pass")
        total += rows
        prints.append(input_fingerprints.file_record(loc.uri, file_info(loc).size, rows,
                                                     hasher, complete))
    state.flush()
    state.write_pending()
    seen_bytes = state.nbytes
    held_in_input = state.held_met()
    table, new_keys, failed_open, input_keys = state.table(retry_failed, keep_keys, samples)
    valid_keys = new_keys + held_in_input
    if samples > 1:  # held and removed in identities: a lowered n leaves samples outside
        held_in_input = state.held_ids
    removed = 0 if limit is not None else len(index.done) - held_in_input
    return Admission(
        table=table, total=total, valid_keys=valid_keys, rejects=state.rejects,
        new_rejects=state.new_rejects, fingerprints=prints, edited=state.edited,
        edited_examples=state.edited_examples, removed=removed, seen_bytes=seen_bytes,
        held=held_in_input, failed_open=failed_open, input_keys=input_keys,
        reject_ids=state.kept_reject_ids, lines_read=parsed, samples=samples)


def _to_generate(digests: np.ndarray, ordinals: np.ndarray, failed: np.ndarray,
                 retry_failed: bool, salt: bytes) -> tuple[AdmissionTable, int]:
    """Of valid keys the run does not hold: the table of those to send (open failures
    only with --retry-failed, else all others), and how many have an open failure."""
    in_failed, _ = sorted_contains(failed, digests)
    go = in_failed if retry_failed else ~in_failed
    return AdmissionTable(digests[go], ordinals[go], salt), int(in_failed.sum())


def _samples_to_generate(digests: np.ndarray, ordinals: np.ndarray, done: np.ndarray,
                         failed: np.ndarray, retry_failed: bool, samples: int,
                         salt: bytes) -> tuple[AdmissionTable, int, int]:
    """Of every valid key (sorted digests, first ordinals), each of its ``samples``
    identities decided alone as ``_to_generate`` decides a key: (the table of identities
    to send, identities the run holds, identities with an open failure)."""
    picked, at, held, failed_open = [], [], 0, 0
    for s in range(samples):
        ids = sample_digests(digests, s)
        is_held = sorted_contains(done, ids)[0]
        is_failed = sorted_contains(failed, ids)[0] & ~is_held
        go = is_failed if retry_failed else ~(is_held | is_failed)
        picked.append(ids[go])
        at.append(ordinals[go])
        held, failed_open = held + int(is_held.sum()), failed_open + int(is_failed.sum())
    ids, ords = np.concatenate(picked), np.concatenate(at)
    order = np.argsort(ids, kind="stable")
    return AdmissionTable(ids[order], ords[order], salt, samples), held, failed_open


def rejects_table(records: list[dict[str, Any]]) -> pa.Table:
    return pa.table({name: [r.get(name) for r in records] for name in REJECTS.names},
                    schema=REJECTS)


def reject_writer(store) -> Callable[[list[dict[str, Any]]], None]:
    """Writes a list of rejects as one part, named by their reject ids (so a rewrite of
    the same rejects replaces itself)."""
    def write(records: list[dict[str, Any]]) -> None:
        store.write_part("rejects", rejects_table(records), [r["reject_id"] for r in records])
    return write


def describe_changes(admission: Admission, previous: Optional[list[dict[str, Any]]]) -> list[str]:
    """What changed in the input since the run last saw it, one line per finding: its
    files (input_fingerprints.changes), then its rows."""
    lines = input_fingerprints.changes(admission.fingerprints, previous)
    if previous is not None and admission.removed:
        lines.append(f"{admission.removed} rows in data/ have no prompt in the input any "
                     f"more (kept)")
    if admission.edited:
        lines.append(f"{admission.edited} prompts were edited under an id already done "
                     f"(kept the earlier output; e.g. {', '.join(admission.edited_examples)}); "
                     f"give edited prompts new ids to generate them")
    return lines
