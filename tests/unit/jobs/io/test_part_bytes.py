"""Trust bytes, not sizes: a part whose bytes changed without changing its size.

Bit rot, or a crash without fsync on local/NFS output, leaves a part of the right size
and a valid-looking sidecar. Its bytes no longer match the sha256 the sidecar recorded
(format 2) and its pages no longer match their checksums, so: a reader of whole parts
(finalize, export) quarantines it instead of trusting it, never writes `complete: true`
without its rows and never crashes on it; a reader of a few columns that decodes a bad
page quarantines it too (a decode error after a good read is damage, not a storage
error); the next resume regenerates its rows. Sidecars of format 1 (runs written before
checksums) are still read as they are.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from jobs.analysis import finalize
from jobs.analysis.export import ExportError, export
from jobs.config import StorageConfig
from jobs.io import part_summary
from jobs.io.run_index import RunIndex
from jobs.io.run_store import RunStore
from tests.support.run_rows import make_row, write_rows


def _run(tmp_path) -> RunStore:
    store = RunStore(str(tmp_path / "run"), StorageConfig())
    write_rows(store, "data", [make_row(f"k{i:02d}", answer="x" * 400) for i in range(8)],
               per_file=4)
    Path(store.loc("progress.json").path).write_text(json.dumps(
        {"status": "succeeded", "remaining": 0}))
    return store


def _flip(path: str, where: float = 0.5) -> None:
    """Change one byte in the middle of the file; its size stays."""
    data = bytearray(Path(path).read_bytes())
    at = int(len(data) * where)
    data[at] ^= 0xFF
    Path(path).write_bytes(bytes(data))


def test_every_new_sidecar_records_its_parts_sha256(tmp_path):
    store = _run(tmp_path)
    index = RunIndex.open(store)
    assert set(index.checksums) == set(store.part_paths("data"))
    import hashlib
    for path, sha in index.checksums.items():
        assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == sha


def test_finalize_refuses_complete_when_a_part_changed_in_place(tmp_path):
    store = _run(tmp_path)
    damaged = store.part_paths("data")[0]
    size = Path(damaged).stat().st_size
    _flip(damaged)
    assert Path(damaged).stat().st_size == size
    assert len(RunIndex.open(store).done) == 8  # the sidecar still fits by size
    with pytest.raises(finalize.FinalizeError, match="4 rows of 1 data part"):
        finalize.finalize(store)
    assert not Path(store.loc("final", "manifest.json").path).exists()
    assert store.quarantined() == [f"data/{Path(damaged).name}"]
    # the next session sees those rows as not done: it regenerates them
    assert len(RunIndex.open(store).done) == 4


def test_finalize_allow_partial_says_what_was_lost(tmp_path):
    store = _run(tmp_path)
    _flip(store.part_paths("data")[1])
    manifest = finalize.finalize(store, allow_partial=True)
    assert manifest["complete"] is False and manifest["row_count"] == 4
    assert list(manifest["missing"]["damaged_parts"].values()) == [4]


def test_export_refuses_a_dataset_with_a_damaged_winner(tmp_path):
    store = _run(tmp_path)
    _flip(store.part_paths("data")[0])
    out = tmp_path / "exp"
    with pytest.raises(ExportError, match="found damaged"):
        export(store, str(out), "pretokenized")
    assert not (out / "export.manifest").exists()


def test_a_bad_page_under_a_column_read_is_quarantined_not_a_crash(tmp_path):
    """Report-style reads decode only some columns, without the whole-part hash: the
    page checksum (or zstd) fails on the flipped byte; that is damage, never an OSError
    out of the reader."""
    store = _run(tmp_path)
    path = store.part_paths("data")[0]
    _flip(path, 0.3)
    table = store.read_part(path)  # every column: the flipped page is decoded
    assert table.num_rows == 0
    assert store.quarantined() == [f"data/{Path(path).name}"]
    reason = json.loads(Path(store.loc("quarantine", "data",
                                       Path(path).name + ".reason.json").path).read_text())
    assert reason["reason"].startswith("DamagedPart")


def test_a_format_1_sidecar_is_still_read_as_it_is(tmp_path):
    store = _run(tmp_path)
    for path in store.part_paths("data"):  # rewrite each sidecar as format 1 wrote it
        loc = store.sidecar_loc("data", Path(path).name)
        summary = pa.ipc.open_file(pa.py_buffer(Path(loc.path).read_bytes())).read_all()
        meta = dict(summary.schema.metadata)
        meta[b"format"] = b"1"
        del meta[b"part_sha256"]
        Path(loc.path).write_bytes(part_summary.encode(summary.replace_schema_metadata(meta)))
    index = RunIndex.open(store)
    assert index.reads == {"sidecar": 2}  # read, not rebuilt: a 900K run keeps its index
    assert len(index.done) == 8 and index.checksums == {}
    assert finalize.finalize(store)["complete"] is True  # no hash to check: still whole
