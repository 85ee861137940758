"""Which rows a regenerate session sends: the latest rows a drained replica produced and
condemned, flagged rows on demand; the records' format; the follow-up's stop rules."""

from __future__ import annotations

import json

import pytest

from jobs.config import StorageConfig
from jobs.io.condemned import FOLDER, read_records, write_record
from jobs.io.run_index import RunIndex
from jobs.io.run_store import RunStore
from jobs.pipeline.settings import REGENERATE, RunMode
from jobs.runs import regenerate
from jobs.runs.errors import RunError
from jobs.runs.run import Summary
from tests.support.run_rows import make_row, write_rows


@pytest.fixture
def store(tmp_path) -> RunStore:
    return RunStore(str(tmp_path / "run"), StorageConfig())


def _drain(replica: str, keys: list[str]) -> dict:
    return {"replica": replica, "reason": "drained: test", "drained_at": 1.0, "keys": keys}


def _targets(store, flagged=False):
    found = regenerate.targets(store, RunIndex.open(store), flagged)
    keys = {}
    for path, rows in found.rows.items():
        table = store.read_part(path, ["key", "version"]).take(rows)
        keys.update(zip(table.column("key").to_pylist(), table.column("version").to_pylist()))
    return found, keys


def test_a_condemned_key_is_regenerated_only_while_its_latest_row_is_the_drained_replicas(store):
    write_rows(store, "data", [make_row("a", replica="bad"), make_row("b", replica="bad"),
                               make_row("c", replica="good"), make_row("d", replica="bad")])
    # a: condemned; b: condemned, then regenerated elsewhere (version 1); c: named but made
    # by another replica; d: made by the drained replica but not in its window
    write_rows(store, "data", [make_row("b", 1, replica="good")])
    write_record(store, _drain("bad", ["a", "b", "c"]))
    found, keys = _targets(store)
    assert keys == {"a": 0}
    assert (found.condemned, found.flagged, dict(found.by_replica)) == (1, 0, {"bad": 1})
    assert regenerate.pending(store) == 1


def test_flagged_rows_are_chosen_only_on_demand_and_only_at_their_latest_version(store):
    write_rows(store, "data", [make_row("a", integrity_flags=["token_run"]),
                               make_row("b", integrity_flags=["empty_answer"]),
                               make_row("c")])
    write_rows(store, "data", [make_row("b", 1)])  # regenerated: sound now
    assert _targets(store)[0].total == 0  # no record, no flag asked: nothing is read
    found, keys = _targets(store, flagged=True)
    assert keys == {"a": 0} and (found.condemned, found.flagged) == (0, 1)


def test_a_part_written_before_the_flags_column_is_checked_on_its_outputs(store):
    write_rows(store, "data", [make_row("a", integrity_flags=None, output_token_ids=[0] * 80),
                               make_row("b", integrity_flags=None)])
    assert _targets(store, flagged=True)[1] == {"a": 0}  # token_run, computed now


def test_rows_of_other_settings_are_refused_naming_them(store):
    write_rows(store, "data", [make_row("a", settings_hash="old", integrity_flags=["token_run"])])
    found, _ = _targets(store, flagged=True)
    with pytest.raises(RunError, match=r"1 rows to regenerate .* other settings \(old \(1 rows\)\)"):
        regenerate.check_settings(found, "h1")
    regenerate.check_settings(found, "old")


def test_a_record_is_the_same_bytes_whoever_writes_it_and_names_its_format(store):
    write_record(store, _drain("replica/1", ["b", "a"]))
    path = store.loc(FOLDER, "replica_1.json").path
    first = open(path, "rb").read()
    write_record(store, _drain("replica/1", ["a", "b"]))
    assert open(path, "rb").read() == first
    assert json.loads(first) == {"format": 1, "replica": "replica/1", "reason": "drained: test",
                                 "drained_at": 1.0, "keys": ["a", "b"]}
    assert read_records(store)[0]["keys"] == ["a", "b"]


def test_a_record_of_an_unknown_format_stops_the_session_naming_the_file(store):
    write_rows(store, "data", [make_row("a")])
    store.loc(FOLDER).fs.create_dir(store.loc(FOLDER).path)
    with open(store.loc(FOLDER, "x.json").path, "w") as f:
        json.dump({"format": 9, "keys": []}, f)
    with pytest.raises(RunError, match=r"condemned/x.json is not a condemned-rows record of "
                                       r"format 1"):
        regenerate.targets(store, RunIndex.open(store), flagged=False)


def test_the_flag_is_its_own_mode():
    assert RunMode.of_flags(regenerate_flagged=True) == RunMode(REGENERATE,
                                                                regenerate_flagged=True)
    assert RunMode.of_flags(regenerate_flagged=True).regenerates
    assert not RunMode.of_flags().regenerates


def test_follow_up_runs_sessions_while_condemned_rows_remain_and_stops_on_failure(store):
    write_rows(store, "data", [make_row("a", replica="bad")])
    write_record(store, _drain("bad", ["a"]))
    sessions = []

    def session():  # the regenerate session: writes the new version
        sessions.append(1)
        write_rows(store, "data", [make_row("a", 1, replica="good")])
        return Summary("succeeded", {"session_rows": 1}, "second")
    done = regenerate.follow_up(store, Summary("succeeded", {}, "first"), session)
    assert sessions == [1] and done.text == "first\nsecond"
    assert regenerate.follow_up(store, Summary("failed", {}, "x"), session).text == "x"
    assert sessions == [1]  # nothing left, and a failed session is never followed


def test_follow_up_gives_up_after_its_passes_and_says_what_is_left(store):
    write_rows(store, "data", [make_row("a", replica="bad")])
    write_record(store, _drain("bad", ["a"]))
    calls = []

    def session():  # a fleet that never regenerates the row
        calls.append(1)
        return Summary("succeeded", {"session_rows": 0}, "again")
    done = regenerate.follow_up(store, Summary("succeeded", {}, "first"), session)
    assert len(calls) == regenerate.FOLLOW_UPS
    assert "condemned: 1 rows of drained replicas are still to regenerate" in done.text


def test_the_flagged_rows_left_are_said_with_keys_tries_and_the_command(store):
    from jobs.analysis.report import build_report
    write_rows(store, "data", [
        make_row("loops", 0, integrity_flags=["token_run"], replica="bad"),
        make_row("loops", 1, integrity_flags=["token_run"], replica="good"),
        make_row("cured", 0, integrity_flags=["empty_answer"]), make_row("cured", 1),
        *[make_row(f"e{i}", integrity_flags=["empty_answer"]) for i in range(6)]])
    fields = regenerate.flagged_fields(build_report(store))
    assert fields["flagged_latest"] == 7
    assert fields["flagged_latest_by_flag"] == {"empty_answer": 6, "token_run": 1}
    assert {"key": "loops", "version": 1} in fields["flagged_latest_keys"]
    line = regenerate.flagged_line(fields)
    assert line.startswith("  flagged:   7 latest rows still carry integrity flags "
                           "(empty_answer 6, token_run 1): e0 (version 0)")
    assert "and 2 more" in line and "--regenerate-flagged" in line
    assert regenerate.flagged_line({"flagged_latest": 0}) == ""
    assert regenerate.flagged_line(None) == ""


def test_a_drain_published_in_the_cluster_is_recorded_under_the_run_once(store, monkeypatch):
    """A drained replica none of whose results reached the job: its published record is
    written at the session's end (the same bytes a result would give), then dropped."""
    from contract import drain_board
    from tests.unit.contract.test_drain_board import FakeKV
    kv = FakeKV()
    monkeypatch.setattr(drain_board, "_kv", lambda: kv)
    write_rows(store, "data", [make_row("a", replica="bad")])
    drain_board.publish("run", _drain("bad", ["a"]))
    assert regenerate.collect_published(store, "run") == 1
    assert read_records(store) == [dict(_drain("bad", ["a"]), format=1)]
    assert regenerate.pending(store) == 1 and kv.data == {}
    assert regenerate.collect_published(store, "run") == 0
