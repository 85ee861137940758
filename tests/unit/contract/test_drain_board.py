"""The drain board's own rules (the real Ray KV path is test_integrity.py's drift trial):
one entry per run and replica, names made safe, and a KV that fails costs a warning,
never the replica's request."""

from __future__ import annotations

import logging

from contract import drain_board


class FakeKV:
    def __init__(self, fail: bool = False):
        self.data: dict[str, str] = {}
        self.fail = fail

    def _internal_kv_put(self, key, value, overwrite=True):
        if self.fail:
            raise ConnectionError("GCS unreachable")
        self.data[key] = value

    def _internal_kv_list(self, prefix):
        return [k.encode() for k in self.data if k.startswith(prefix)]

    def _internal_kv_get(self, key):
        value = self.data.get(key.decode() if isinstance(key, bytes) else key)
        return value.encode() if value is not None else None

    def _internal_kv_del(self, key):
        self.data.pop(key, None)


def test_records_go_per_run_and_replica_and_are_removed_once_written(monkeypatch):
    kv = FakeKV()
    monkeypatch.setattr(drain_board, "_kv", lambda: kv)
    record = {"replica": "app#rep/1", "reason": "drained", "drained_at": 1.0, "keys": ["a"]}
    assert drain_board.publish("run one", record)
    assert drain_board.publish("other", dict(record, keys=["b"]))
    (entry, got), = drain_board.published("run one")
    assert entry == "raygen/drains/run_one/app_rep_1" and got == record
    drain_board.remove(entry)
    assert drain_board.published("run one") == [] and len(drain_board.published("other")) == 1


def test_without_ray_or_with_a_failing_kv_nothing_is_published(monkeypatch, caplog):
    assert drain_board.published("run") == []  # no Ray here
    assert not drain_board.publish("run", {"replica": "r", "keys": []})
    monkeypatch.setattr(drain_board, "_kv", lambda: FakeKV(fail=True))
    with caplog.at_level(logging.WARNING, "raygen"):
        assert not drain_board.publish("run", {"replica": "r", "keys": []})
    assert "drain record of r not published: GCS unreachable" in caplog.text
