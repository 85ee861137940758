"""jobs.pipeline.admission_cache: a resume goes on from the recorded admission pass
(unchanged files unread, a grown file parsed only past its old lines) and decides exactly
what a whole pass would; anything that could change a verdict runs the whole pass."""

from __future__ import annotations

import json
import logging
import os
import random

import numpy as np
import pytest

from jobs.config import StorageConfig, parse_config
from jobs.io import sources
from jobs.io.run_index import RunIndex
from jobs.io.run_store import RunStore
from jobs.io.storage import locate
from jobs.pipeline import admission, admission_cache
from jobs.pipeline.admission import admit_inputs
from jobs.runs import plans
from tests.support.held_index import holding

STORAGE = StorageConfig()


def prompt_lines(rng: random.Random, n: int, prefix: str = "k") -> list[str]:
    """Valid rows, later duplicates, blank lines and invalid lines, in random order."""
    out = []
    for i in range(n):
        r = rng.random()
        if r < 0.08:
            out.append("{not json")
        elif r < 0.12:
            out.append("")
        elif r < 0.2 and i:
            out.append(json.dumps({"id": f"k{rng.randrange(i)}", "messages": [
                {"role": "user", "content": "dup"}]}))
        else:
            out.append(json.dumps({"id": f"{prefix}{i}", "messages": [
                {"role": "user", "content": f"q{i}"}]}))
    return out


def write_lines(path, lines: list[str], mode: str = "w") -> None:
    with open(path, mode) as f:
        f.write("".join(f"{x}\n" for x in lines))


def setup_run(tmp_path, lines: list[str]):
    path = tmp_path / "p.jsonl"
    write_lines(path, lines)
    store = RunStore(str(tmp_path / "run"), STORAGE)
    store.init_run_file()
    return store, [locate(str(path), STORAGE)]


def first_pass(store, inputs, limit=None) -> admission.Admission:
    result = admit_inputs(inputs, RunIndex.open(store), False, lambda part: None, limit,
                          keep_keys=True)
    assert admission_cache.save(store, inputs, limit, sources.MAX_LINE_BYTES, result)
    return result


def index_later(result, store, rng: random.Random) -> RunIndex:
    """What the run holds a session later: some input keys done, some failed, the rejects
    written, and a key from outside the input."""
    index = holding({})
    digests = result.input_keys[0]
    done = digests[[rng.random() < 0.4 for _ in digests]]
    failed = digests[[rng.random() < 0.2 for _ in digests]]
    index.latest["digest"] = np.sort(np.append(done, np.uint64(12345)))
    index.latest["prompt"] = np.zeros(len(index.latest["digest"]), np.uint64)
    index.failed = np.sort(failed)
    index.reject_ids = set(result.reject_ids)
    index.store = store  # its salt
    return index


def grow(tmp_path, inputs, rng: random.Random, how: str) -> list:
    """The input a session later: unchanged, lines appended (new keys, duplicates of old
    ones, bad lines identical to old ones), or a second file added."""
    extra = prompt_lines(rng, rng.randrange(1, 40), prefix="t") + [
        "{not json", json.dumps({"id": "k0", "messages": [{"role": "user", "content": "x"}]})]
    if how == "appended":
        write_lines(inputs[0].path, extra, "a")
        return inputs
    if how == "added file":
        write_lines(tmp_path / "q.jsonl", extra)
        return inputs + [locate(str(tmp_path / "q.jsonl"), STORAGE)]
    return inputs


def same_admission(reused: admission.Admission, whole: admission.Admission) -> None:
    assert np.array_equal(reused.table.digests, whole.table.digests)
    assert np.array_equal(reused.table.ordinals, whole.table.ordinals)
    assert reused.table.salt == whole.table.salt
    for name in ("total", "valid_keys", "rejects", "new_rejects", "held", "failed_open",
                 "removed", "fingerprints", "edited"):
        assert getattr(reused, name) == getattr(whole, name), name
    assert sorted(reused.reject_ids) == sorted(whole.reject_ids)  # found in another order
    for a, b in zip(reused.input_keys, whole.input_keys):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("how", ["unchanged", "appended", "added file"])
@pytest.mark.parametrize("retry_failed", [False, True])
def test_going_on_from_the_record_decides_exactly_what_a_whole_pass_decides(
        tmp_path, seed, how, retry_failed, monkeypatch):
    rng = random.Random(seed)
    store, inputs = setup_run(tmp_path, prompt_lines(rng, rng.randrange(1, 200)))
    result = first_pass(store, inputs)
    index = index_later(result, store, rng)
    inputs = grow(tmp_path, inputs, rng, how)
    whole_rejects: list = []
    whole = admit_inputs(inputs, index, retry_failed, whole_rejects.extend, keep_keys=True)
    recorded = admission_cache.load(store, inputs, None, sources.MAX_LINE_BYTES, index)
    assert recorded is not None
    assert recorded.reads[0] == {"unchanged": "same", "appended": "tail",
                                 "added file": "same"}[how]
    read = []
    real = admission.iter_rows
    monkeypatch.setattr(admission, "iter_rows", lambda *a: read.append(a[0].uri) or real(*a))
    reused_rejects: list = []
    reused = admit_inputs(inputs, index, retry_failed, reused_rejects.extend, keep_keys=True,
                          recorded=recorded)
    same_admission(reused, whole)
    key = lambda r: r["reject_id"]  # noqa: E731
    assert ([{**r, "rejected_at": None} for r in sorted(reused_rejects, key=key)]
            == [{**r, "rejected_at": None} for r in sorted(whole_rejects, key=key)])
    assert reused.lines_read == whole.total - result.total  # only the new lines parsed
    assert read == ([] if how == "unchanged" else [inputs[-1].uri])


def test_a_grown_file_whose_old_bytes_changed_runs_a_whole_pass(tmp_path, caplog):
    lines = prompt_lines(random.Random(5), 60)
    store, inputs = setup_run(tmp_path, lines)
    result = first_pass(store, inputs)
    index = holding({}, reject_ids=result.reject_ids)
    index.store = store
    first = next(i for i, x in enumerate(lines) if '"q' in x)
    edited = list(lines)
    edited[first] = lines[first].replace('"q', '"Q')  # same size: only the bytes differ
    write_lines(inputs[0].path, edited + [json.dumps(
        {"id": "z", "messages": [{"role": "user", "content": "z"}]})])
    recorded = admission_cache.load(store, inputs, None, sources.MAX_LINE_BYTES, index)
    assert recorded is not None and recorded.reads == ["tail"]
    with pytest.raises(admission.PrefixChanged, match="first .* bytes changed"):
        admit_inputs(inputs, index, False, lambda p: None, recorded=recorded)
    cfg = parse_config({"job": {"input": inputs[0].path, "output": str(tmp_path),
                                "run_name": "run"}})
    written: list = []
    with caplog.at_level(logging.INFO, logger="raygen"):
        got = plans.admit(cfg, store, inputs, index, False, written.extend)
    assert "running the whole admission pass" in caplog.text
    whole = admit_inputs(inputs, index, False, lambda p: None)
    assert np.array_equal(got.table.digests, whole.table.digests)
    assert got.total == whole.total == result.total + 1


def test_the_plan_records_the_pass_and_the_next_session_reads_nothing(tmp_path, caplog):
    store, inputs = setup_run(tmp_path, prompt_lines(random.Random(6), 80))
    cfg = parse_config({"job": {"input": inputs[0].path, "output": str(tmp_path),
                                "run_name": "run"}})
    first = plans.admit(cfg, store, inputs, RunIndex.open(store), False, lambda p: None)
    assert first.input_keys is None  # recorded, then let go: not held all session
    # the next session, every reject of the first one written (as its build() does)
    index = holding({}, reject_ids=first_rejects(first, store, inputs))
    index.store = store
    with caplog.at_level(logging.INFO, logger="raygen"):
        again = plans.admit(cfg, store, inputs, index, False, lambda p: None)
    assert "the recorded pass reused: 1 input files unread, 0 new lines parsed" in caplog.text
    assert np.array_equal(again.table.digests, first.table.digests)
    assert again.total == first.total and again.rejects == first.rejects


def first_rejects(first, store, inputs) -> list[str]:
    whole = admit_inputs(inputs, RunIndex.open(store), False, lambda p: None, keep_keys=True)
    assert whole.rejects == first.rejects
    return whole.reject_ids


def changed_input(store, inputs):
    with open(inputs[0].path, "r+") as f:  # rewritten, not appended: a whole pass
        f.write("{")


def touched_input(store, inputs):
    st = os.stat(inputs[0].path)
    os.utime(inputs[0].path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def other_salt(store, inputs):
    with open(os.path.join(store.root.path, "run.json"), "w") as f:
        json.dump({"run_format": 3, "key_salt": "cd" * 16}, f)
    store._run_file = None


@pytest.mark.parametrize("change", [changed_input, touched_input, other_salt])
def test_anything_that_could_change_a_verdict_runs_the_pass(tmp_path, change):
    store, inputs = setup_run(tmp_path, prompt_lines(random.Random(1), 50))
    result = first_pass(store, inputs)
    change(store, inputs)
    index = holding({}, reject_ids=result.reject_ids)
    index.store = store
    assert admission_cache.load(store, inputs, None, sources.MAX_LINE_BYTES, index) is None


def test_another_limit_line_cap_file_list_or_raygen_version_runs_the_pass(tmp_path,
                                                                        monkeypatch):
    store, inputs = setup_run(tmp_path, prompt_lines(random.Random(2), 50))
    result = first_pass(store, inputs)
    index = holding({}, reject_ids=result.reject_ids)
    index.store = store

    def load(files=inputs, limit=None, cap=sources.MAX_LINE_BYTES):
        return admission_cache.load(store, files, limit, cap, index)
    assert load() is not None
    assert load(limit=10) is None and load(cap=1024) is None
    write_lines(tmp_path / "q.jsonl", prompt_lines(random.Random(3), 5))
    other = locate(str(tmp_path / "q.jsonl"), STORAGE)
    assert load(files=[other] + inputs) is None  # a file before the recorded one
    assert load(files=inputs + [other]) is not None  # a file after it: read, the rest not
    monkeypatch.setattr(admission_cache, "_code_hash", lambda: "another raygen")
    assert load() is None


def test_rejects_not_yet_written_run_the_pass(tmp_path):
    # the session that recorded the pass died before its rejects were written
    store, inputs = setup_run(tmp_path, prompt_lines(random.Random(3), 80))
    result = first_pass(store, inputs)
    assert result.reject_ids
    index = holding({}, reject_ids=result.reject_ids[1:])
    index.store = store
    assert admission_cache.load(store, inputs, None, sources.MAX_LINE_BYTES, index) is None


def test_a_damaged_record_runs_the_pass_with_a_warning(tmp_path, caplog):
    store, inputs = setup_run(tmp_path, prompt_lines(random.Random(4), 20))
    first_pass(store, inputs)
    loc = store.loc(*admission_cache.NAME)
    with open(loc.path, "r+b") as f:  # torn: its footer gone
        f.truncate(os.path.getsize(loc.path) // 2)
    with caplog.at_level(logging.WARNING, logger="raygen"):
        assert admission_cache.load(store, inputs, None, sources.MAX_LINE_BYTES,
                                    holding({})) is None
    assert "keys.arrow is unreadable" in caplog.text


def test_an_input_with_too_many_rejects_is_not_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(admission_cache, "MAX_REJECT_IDS", 1)
    store, inputs = setup_run(tmp_path, ["{bad", "{bad too", json.dumps(
        {"id": "a", "messages": [{"role": "user", "content": "q"}]})])
    result = admit_inputs(inputs, holding({}), False, lambda p: None,
                          keep_keys=True)
    assert not admission_cache.save(store, inputs, None, sources.MAX_LINE_BYTES, result)
    assert not os.path.exists(store.loc(*admission_cache.NAME).path)
