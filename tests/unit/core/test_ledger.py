"""jobs.ledger: the admit (resume) logic, on the plain class behind @ray.remote.

``KeyLedger`` is a ray ActorClass; ``__ray_actor_class__`` is the original class Ray
keeps for itself (ray/actor.py ``_modify_class``), so the logic runs without a cluster.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from jobs.ledger import GO, SKIP, KeyLedger, admit_batch, place_of
from jobs.validate import VALIDATED

Ledger = KeyLedger.__ray_actor_class__


def make(done=(), failed=(), rejected=(), retry_failed=False):
    return Ledger(set(done), set(failed), set(rejected), retry_failed)


def test_plain_class_is_the_original():
    assert Ledger.__name__ == "KeyLedger"
    assert Ledger.__module__ == "jobs.ledger"
    assert "admit" in vars(Ledger)


def test_new_keys_go_done_and_failed_skip():
    ledger = make(done={"d"}, failed={"f"})
    verdicts = ledger.admit(["d", "f", "n"], ["a:1", "a:2", "a:3"], [False] * 3)
    assert verdicts == [SKIP, SKIP, GO]


def test_retry_failed_admits_only_failed():
    ledger = make(done={"d"}, failed={"f", "g"}, retry_failed=True)
    verdicts = ledger.admit(["d", "f", "n", "g"], ["a:1", "a:2", "a:3", "a:4"], [False] * 4)
    assert verdicts == [SKIP, GO, SKIP, GO]


def test_failed_then_done_is_not_retried():
    # A key that failed once and later succeeded is done: --retry-failed skips it.
    ledger = make(done={"k"}, failed={"k"}, retry_failed=True)
    assert ledger.admit(["k"], ["a:1"], [False]) == [SKIP]
    assert ledger.counts()["failed_open"] == 0


def test_duplicate_names_first_place():
    ledger = make()
    verdicts = ledger.admit(["k", "x", "k"], ["s3://b/p.jsonl:3", "s3://b/p.jsonl:4",
                                              "s3://b/p.jsonl:9"], [False] * 3)
    assert verdicts[:2] == [GO, GO]
    assert verdicts[2] == "duplicate id 'k': first seen at s3://b/p.jsonl:3"


def test_duplicate_across_calls_and_of_done_key():
    ledger = make(done={"k"})
    assert ledger.admit(["k"], ["a:1"], [False]) == [SKIP]
    assert ledger.admit(["k"], ["b:7"], [False]) == ["duplicate id 'k': first seen at a:1"]


def test_rejected_place_is_skipped_even_if_now_valid():
    ledger = make(rejected={"a:2"})
    assert ledger.admit(["k", "k2"], ["a:2", "a:3"], [False, False]) == [SKIP, GO]
    # the skipped row did not claim the key: a later row with it is not a duplicate
    assert ledger.admit(["k"], ["a:9"], [False]) == [GO]


def test_rejected_place_skipped_when_invalid_too():
    ledger = make(rejected={"a:2"})
    assert ledger.admit([None], ["a:2"], [True]) == [SKIP]


def test_invalid_rows_pass_through_without_claiming_keys():
    ledger = make(done={"d"})
    verdicts = ledger.admit([None, None, "d"], ["a:1", "a:2", "a:3"], [True, True, True])
    assert verdicts == [GO, GO, GO]
    assert ledger.counts()["seen"] == 0


def test_invalid_rows_pass_through_with_retry_failed():
    ledger = make(retry_failed=True)
    assert ledger.admit([None], ["a:1"], [True]) == [GO]


def test_counts():
    ledger = make(done={"a", "b"}, failed={"b", "c"}, rejected={"x:1"})
    ledger.admit(["n", "m"], ["y:1", "y:2"], [False, False])
    assert ledger.counts() == {"done": 2, "failed_open": 1, "rejected": 1, "seen": 2}


def test_place_of():
    assert place_of("s3://b/p.jsonl", 12) == "s3://b/p.jsonl:12"


class _Remote:
    """Stand-in for an actor handle: ledger.admit.remote(...) -> the plain result."""

    def __init__(self, ledger):
        self.admit = type("M", (), {"remote": staticmethod(ledger.admit)})()


def test_admit_batch_filters_and_marks_duplicates(monkeypatch):
    import jobs.ledger as mod
    monkeypatch.setattr(mod.ray, "get", lambda value: value)
    ledger = make(done={"d"}, rejected={"f.jsonl:5"})
    rows = [
        dict(source="f.jsonl", line=1, key="d", reject_reason=None),      # done -> dropped
        dict(source="f.jsonl", line=2, key="n", reject_reason=None),      # go
        dict(source="f.jsonl", line=3, key=None, reject_reason="bad"),    # invalid -> go
        dict(source="f.jsonl", line=4, key="n", reject_reason=None),      # duplicate
        dict(source="f.jsonl", line=5, key="z", reject_reason=None),      # rejected -> dropped
    ]
    cols = {name: [r.get(name) for r in rows] for name in VALIDATED.names}
    out = admit_batch(pa.table(cols, schema=VALIDATED), _Remote(ledger)).to_pylist()
    assert [r["line"] for r in out] == [2, 3, 4]
    assert [r["reject_reason"] for r in out] == [
        None, "bad", "duplicate id 'n': first seen at f.jsonl:2"]
