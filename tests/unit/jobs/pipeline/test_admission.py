"""jobs.pipeline.admission: the driver's pass decides every row as a pure function of the input
and the run's files; the admit stage is a stateless filter over its table."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.pipeline import admission
from jobs.pipeline.admission import admit_inputs, describe_changes, digests_of, key_digest
from jobs.pipeline.admission_table import AdmissionTable
from jobs.pipeline.admit_stage import admit_batch
from jobs.config import StorageConfig
from jobs.io.sources import ordinal_of
from jobs.io.storage import locate
from jobs.pipeline.validate import parse_row, validate_batch
from tests.support.held_index import holding

STORAGE = StorageConfig()


def line(row_id=None, text="hi", **extra) -> str:
    row = {"messages": [{"role": "user", "content": text}], **extra}
    if row_id is not None:
        row["id"] = row_id
    return json.dumps(row)


def write(path, lines) -> str:
    path.write_text("".join(f"{x}\n" for x in lines))
    return str(path)


def run_pass(paths, prior=None, retry_failed=False, limit=None):
    written = []
    result = admit_inputs([locate(p, STORAGE) for p in paths], prior or holding({}),
                          retry_failed, written.extend, limit)
    return result, written


def chosen(result, paths) -> set[tuple[str, int]]:
    """(file, line) of every admitted row."""
    out = set()
    for o in result.table.ordinals.tolist():
        out.add((paths[o >> 40], o & ((1 << 40) - 1)))
    return out


def test_first_occurrence_in_input_order_wins_across_files_and_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(admission, "CHUNK_ROWS", 3)  # duplicates across chunk boundaries
    a = write(tmp_path / "a.jsonl", [line("k1"), line("k2"), line("k1", "other"),
                                     line("k3"), line("k4"), line("k2")])
    b = write(tmp_path / "b.jsonl", [line("k5"), line("k1"), line("k3")])
    result, rejects = run_pass([a, b])
    assert chosen(result, [a, b]) == {(a, 1), (a, 2), (a, 4), (a, 5), (b, 1)}
    assert result.total == 9 and result.valid_keys == 5 and result.rejects == 4
    reasons = sorted((r["source"], r["line"], r["reason"]) for r in rejects)
    assert reasons == [
        (a, 3, f"duplicate id 'k1': first seen at {a}:1"),
        (a, 6, f"duplicate id 'k2': first seen at {a}:2"),
        (b, 2, f"duplicate id 'k1': first seen at {a}:1"),
        (b, 3, f"duplicate id 'k3': first seen at {a}:4")]


def test_the_pass_is_pure_so_a_rerun_gives_the_same_verdicts(tmp_path):
    a = write(tmp_path / "a.jsonl", [line("x"), "{bad", line("x"), line(text="q"),
                                     line(text="q")])
    first, r1 = run_pass([a])
    again, r2 = run_pass([a])
    assert np.array_equal(first.table.digests, again.table.digests)
    assert np.array_equal(first.table.ordinals, again.table.ordinals)
    assert [r["reject_id"] for r in r1] == [r["reject_id"] for r in r2]
    assert len(r1) == 3  # the bad line, the duplicate id, the duplicate id-less prompt


def test_done_and_failed_rows_skip_retry_failed_sends_only_open_failures(tmp_path):
    a = write(tmp_path / "a.jsonl", [line("d"), line("f"), line("n"), line("g")])
    prior = holding({"d": None, "g": None}, ["f", "g"], [])
    plain, _ = run_pass([a], prior)
    assert chosen(plain, [a]) == {(a, 3)}
    retry, _ = run_pass([a], prior, retry_failed=True)
    assert chosen(retry, [a]) == {(a, 2)}  # g failed once, then succeeded: done


def test_known_rejects_are_not_written_again_even_after_an_inserted_line(tmp_path):
    a = write(tmp_path / "a.jsonl", [line("k1"), "{bad", line("k1"), line("k2")])
    first, written = run_pass([a])
    prior = holding({"k1": None}, [], [r["reject_id"] for r in written])
    # the operator inserts a line at the top: every line number moves
    write(tmp_path / "a.jsonl", [line("new"), line("k1"), "{bad", line("k1"), line("k2")])
    second, again = run_pass([a], prior)
    assert again == [] and second.rejects == first.rejects == 2
    assert chosen(second, [a]) == {(a, 1), (a, 5)}  # the new row and k2, not skipped


def test_identical_bad_lines_are_each_one_reject(tmp_path):
    a = write(tmp_path / "a.jsonl", ["{bad", "{bad"])
    _, written = run_pass([a])
    assert len({r["reject_id"] for r in written}) == 2


def test_renamed_input_is_reported_and_changes_nothing(tmp_path):
    lines = [line("k1"), line("k2")]
    a = write(tmp_path / "a.jsonl", lines)
    first, _ = run_pass([a])
    b = write(tmp_path / "b.jsonl", lines)
    second, _ = run_pass([b], holding({"k1": None, "k2": None}, [], []))
    assert len(second.table) == 0
    notes = describe_changes(second, first.fingerprints)
    assert any(f"{b} has the content of {a} (renamed or moved)" in n for n in notes), notes


def test_edited_prompt_under_a_done_id_is_reported(tmp_path):
    a = write(tmp_path / "a.jsonl", [line("k1", "old"), line("k2")])
    before = {k: parse_row(x)["prompt_hash"] for k, x in (("k1", line("k1", "old")),
                                                           ("k2", line("k2")))}
    write(tmp_path / "a.jsonl", [line("k1", "new text"), line("k3")])
    result, _ = run_pass([a], holding(before, [], []))
    assert result.edited == 1 and result.edited_examples == ["k1"]
    assert result.removed == 1  # k2 is gone from the input
    notes = "\n".join(describe_changes(result, [{"uri": a, "rows": 2, "sha256": "x"}]))
    assert "1 prompts were edited under an id already done" in notes
    assert "1 rows in data/ have no prompt in the input any more" in notes
    assert f"input {a} changed since the last session: 2 -> 2 rows" in notes


def test_fingerprint_and_limit(tmp_path):
    a = write(tmp_path / "a.jsonl", [line(f"k{i}") for i in range(5)])
    full, _ = run_pass([a])
    assert full.fingerprints[0]["rows"] == 5 and len(full.fingerprints[0]["sha256"]) == 64
    assert full.fingerprints[0]["size"] == (tmp_path / "a.jsonl").stat().st_size
    part, _ = run_pass([a], limit=2)
    assert part.total == 2 and len(part.table) == 2 and part.fingerprints[0]["sha256"] is None


def test_table_is_sixteen_bytes_per_key():
    n = 1000
    table = AdmissionTable(np.sort(digests_of(f"k{i}" for i in range(n))),
                           np.arange(n, dtype=np.int64))
    assert table.nbytes == 16 * n


def _validated(rows: list[tuple[str, int, str]]) -> pa.Table:
    return validate_batch(pa.table({
        "source": [s for s, _, _ in rows], "line": [n for _, n, _ in rows],
        "ordinal": [ordinal_of(0, n) for _, n, _ in rows], "raw": [r for _, _, r in rows],
        "problem": [None] * len(rows)}))


def test_admit_batch_keeps_exactly_the_chosen_rows_every_time(tmp_path):
    a = write(tmp_path / "a.jsonl", [line("k1"), line("k1"), "{bad", line("k2")])
    result, _ = run_pass([a])
    batch = _validated([(a, 1, line("k1")), (a, 2, line("k1")), (a, 3, "{bad"),
                        (a, 4, line("k2")), (a, 5, line("k9"))])
    out = admit_batch(batch, result.table)
    assert out.column("line").to_pylist() == [1, 4]
    assert admit_batch(batch, result.table).equals(out)  # a re-executed task: same rows


def test_admit_batch_with_an_empty_table_keeps_nothing():
    empty = AdmissionTable(np.empty(0, np.uint64), np.empty(0, np.int64))
    assert admit_batch(_validated([("a", 1, line("k"))]), empty).num_rows == 0


def test_admit_batch_fetches_the_table_from_an_object_ref(monkeypatch):
    table = AdmissionTable(np.array([key_digest("k")], np.uint64), np.array([1], np.int64))

    class Ref:
        def hex(self):
            return "ref-1"

    import ray
    calls = []
    monkeypatch.setattr(ray, "get", lambda ref: calls.append(ref) or table)
    batch = _validated([("a", 1, line("k"))])
    for _ in range(2):
        assert admit_batch(batch, [Ref()]).num_rows == 1
    assert len(calls) == 1  # once per worker


def test_jsonl_and_parquet_exports_give_the_same_keys(tmp_path):
    rows = [{"id": None, "category": "c", "messages": [
        {"role": "user", "content": "hi", "name": None, "tool_calls": None}], "tools": None},
        {"id": 7, "messages": [{"role": "user", "content": "x"}]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    jsonl = write(tmp_path / "p.jsonl", [
        json.dumps({"messages": [{"content": "hi", "role": "user"}], "category": "c"}),
        json.dumps({"messages": [{"role": "user", "content": "x"}], "id": 7})])
    from_parquet, _ = run_pass([str(tmp_path / "p.parquet")])
    from_jsonl, _ = run_pass([jsonl])
    assert np.array_equal(from_parquet.table.digests, from_jsonl.table.digests)
    assert len(from_jsonl.table) == 2


@pytest.mark.parametrize("ids", [(1, "1"), ("int:1", 1)])
def test_integer_and_string_ids_never_collide_silently(tmp_path, ids):
    a = write(tmp_path / "a.jsonl", [line(ids[0]), line(ids[1])])
    result, rejects = run_pass([a])
    # either two distinct keys or a reject that names the reason: never a silent merge
    assert len(result.table) + len(rejects) == 2
    assert not any(r["reason"].startswith("duplicate") for r in rejects)


def test_seen_keys_stay_few_sorted_runs_and_find_every_key():
    from jobs.pipeline.seen_keys import SeenKeys
    seen = SeenKeys()
    rng = np.random.default_rng(0)
    all_digests = rng.permutation(np.arange(1, 5001, dtype=np.uint64))
    for start in range(0, 5000, 100):
        chunk = all_digests[start:start + 100]
        seen.add_new(chunk, chunk.astype(np.int64) * 10)
    assert len(seen.runs) <= 8  # a binary counter of runs, not one per chunk
    assert all(np.all(np.diff(run) > 0) for run, _, _ in seen.runs)
    assert seen.contains(np.array([1, 5000, 5001], np.uint64)).tolist() == [True, True, False]
    assert seen.bump(42) == (2, 420) and seen.bump(42) == (3, 420)
    digests, ordinals, _ = seen.merged()
    assert digests.tolist() == list(range(1, 5001)) and ordinals[41] == 420


def test_duplicates_of_held_keys_get_the_same_verdicts_as_on_a_fresh_run(tmp_path, monkeypatch):
    """Keys the run holds are tracked beside the run index's digests, not in SeenKeys: a
    duplicate of a held key is still a reject naming its first place, with the same
    reject id as on a fresh run, across chunks and files; only new keys are admitted."""
    monkeypatch.setattr(admission, "CHUNK_ROWS", 2)
    a = write(tmp_path / "a.jsonl", [line("h1"), line("n1"), line("h1", "other"),
                                     line("h2"), line("n1")])
    b = write(tmp_path / "b.jsonl", [line("h1"), line("n2"), line("h2")])
    fresh, fresh_rejects = run_pass([a, b])
    prior = holding({"h1": None, "h2": None, "gone": None}, [], [])
    held, held_rejects = run_pass([a, b], prior)
    assert chosen(held, [a, b]) == {(a, 2), (b, 2)}  # n1, n2: the held keys are skipped
    assert chosen(fresh, [a, b]) == {(a, 1), (a, 2), (a, 4), (b, 2)}
    assert held.valid_keys == fresh.valid_keys == 4 and held.rejects == fresh.rejects == 4
    assert held.removed == 1  # "gone" is held but no longer in the input
    key = lambda r: (r["source"], r["line"], r["reason"], r["reject_id"])  # noqa: E731
    assert sorted(map(key, held_rejects)) == sorted(map(key, fresh_rejects))
    assert (b, 1, f"duplicate id 'h1': first seen at {a}:1") in {
        (r["source"], r["line"], r["reason"]) for r in held_rejects}


def test_an_edited_prompt_is_reported_once_even_when_its_id_repeats(tmp_path):
    a = write(tmp_path / "a.jsonl", [line("h", "new text"), line("h", "new text")])
    stored = parse_row(line("h", "old text"))["prompt_hash"]
    result, rejects = run_pass([a], holding({"h": stored}, [], []))
    assert result.edited == 1 and len(rejects) == 1 and len(result.table) == 0
