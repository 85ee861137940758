"""Local writes: fsynced and renamed, nothing left behind on error, a full disk named.
(The real full disk is tests/integration/test_full_disk.py, on a mounted tmpfs.)"""

from __future__ import annotations

import errno
import os
import pickle

import pytest

from jobs.io import storage
from jobs.io.storage import StorageFull, exception_chain, storage_full, write_local_durably
from jobs.runs.run import find_cause


def _failing_write(code: int):
    def write(fd, data):
        raise OSError(code, os.strerror(code))
    return write


def test_the_file_and_its_directory_are_fsynced(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(storage.os, "fsync", lambda fd: (synced.append(
        os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    target = tmp_path / "d" / "x.json"
    write_local_durably(str(target), b"{}")
    assert target.read_bytes() == b"{}"
    assert synced[0].startswith(str(tmp_path / "d" / ".x.json.tmp-"))  # the temp, before rename
    assert synced[1] == str(tmp_path / "d")  # then the rename itself


def test_a_full_disk_leaves_no_temp_and_names_the_file(tmp_path, monkeypatch):
    target = tmp_path / "part.parquet"
    target.write_bytes(b"old")
    monkeypatch.setattr(storage.os, "write", _failing_write(errno.ENOSPC))
    with pytest.raises(StorageFull) as info:
        write_local_durably(str(target), b"new bytes")
    assert str(info.value) == f"[Errno 28] No space left on device: '{target}'"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part.parquet"]
    assert target.read_bytes() == b"old"  # the old file stays whole


def test_other_errors_name_the_file_and_are_not_storage_full(tmp_path, monkeypatch):
    monkeypatch.setattr(storage.os, "write", _failing_write(errno.EIO))
    with pytest.raises(OSError) as info:
        write_local_durably(str(tmp_path / "x"), b"data")
    assert not isinstance(info.value, StorageFull)
    assert info.value.errno == errno.EIO and info.value.filename == str(tmp_path / "x")
    assert storage_full(info.value) is None
    assert list(tmp_path.iterdir()) == []


def test_storage_full_is_found_through_wrappers_and_pickling():
    full = StorageFull("[Errno 28] No space left on device: '/out/run/data/part-1.parquet'")
    # Ray Data appends its retry advice to args[0]; Ray pickles the error to the driver.
    full.args = (f"{full.args[0]}\nFailed to apply UDF transform after 1/1 attempts",)
    full = pickle.loads(pickle.dumps(full))
    try:
        try:
            raise full
        except StorageFull as inner:
            raise RuntimeError("dataset failed") from inner
    except RuntimeError as outer:
        found = storage_full(outer)
    assert found == "[Errno 28] No space left on device: '/out/run/data/part-1.parquet'"

    class TaskError(Exception):  # Ray's RayTaskError carries the worker's error as .cause
        cause = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert storage_full(TaskError("ray::Write()")) == "[Errno 122] Disk quota exceeded"
    assert storage_full(ValueError("no")) is None


def test_the_exception_chain_is_walked_once_through_ray_task_errors():
    class Breaker(Exception):
        pass

    class TaskError(Breaker):  # RayTaskError(Breaker): a Breaker saying Ray's text
        cause = Breaker("too many failures")

    try:
        try:
            raise TaskError("ray::GenerateRows() traceback ...")
        except TaskError as inner:
            raise RuntimeError("dataset failed") from inner
    except RuntimeError as exc:
        outer = exc
    assert [type(e) for e in exception_chain(outer)] == [RuntimeError, Breaker]
    assert str(find_cause(outer, Breaker)) == "too many failures"  # the worker's own text
    assert find_cause(outer, KeyError) is None

    loop = ValueError("a")  # a cycle ends the walk instead of looping
    loop.__context__ = KeyError("b")
    loop.__context__.__context__ = loop
    assert [type(e) for e in exception_chain(loop)] == [ValueError, KeyError]
