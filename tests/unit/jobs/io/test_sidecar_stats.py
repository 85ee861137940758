"""Format-4 to 6 data sidecars keep the report's per-row statistics, so the end-of-
session report reads no data part; format 1-3 sidecars stay valid (the report reads their
parts' columns instead), a format-4 one answers all but integrity_flags (format 5's), a
format-5 one answers setting (format 6's) as nulls without reading its part, and every
way gives the same report."""

from __future__ import annotations

import datetime as dt
import os

import numpy as np
import pyarrow as pa
import pytest

from jobs.analysis import report
from jobs.config import StorageConfig
from jobs.io import part_summary
from jobs.io.run_index import RunIndex
from jobs.io.run_store import RunStore
from tests.support.run_rows import (T0, failure_row, make_row, reject_row,
                                    sidecar_as_format_3, sidecar_as_format_4,
                                    sidecar_as_format_5, write_rows)

SIDECAR_OWN = {"version", "created_at", "finish_reason", "completion_tokens", "settings_hash"}


def varied_rows(n: int = 240) -> list[dict]:
    """Rows whose report columns all vary, nulls included, some continued."""
    rng = np.random.default_rng(7)
    rows = []
    for i in range(n):
        tokens = int(rng.integers(10, 5000))
        cut = tokens > 4000
        rows.append(make_row(
            f"k{i:04d}", completion_tokens=min(tokens, 4096),
            category=None if i % 17 == 0 else f"cat{i % 5}",
            finish_reason="length" if cut else ("stop" if i % 9 else "abort"),
            finished_thinking=bool(i % 3) if cut else True,
            prompt_tokens=int(rng.integers(5, 6000)), reasoning_tokens=tokens // 3,
            budget_clamped_by="context" if i % 11 == 0 else "",
            effective_max_new_tokens=3000 if i % 11 == 0 else 4096,
            spec_verify_ct=None if i % 2 else int(rng.integers(1, 900)),
            repetition_ratio=float(rng.random()), latency_s=float(rng.random() * 30),
            replica=f"r{i % 3}", max_thinking_tokens=None if i % 4 else 1024,
            created_at=T0 + dt.timedelta(milliseconds=int(rng.integers(0, 10**7))),
            settings_hash=f"h{i % 2}"))
    for i in range(0, n, 7):  # continued: a later version with more tokens
        rows.append(make_row(f"k{i:04d}", 1, completion_tokens=4500, continuations=1,
                             max_new_tokens=8192, finish_reason="stop",
                             created_at=T0 + dt.timedelta(days=1, seconds=i),
                             replica="r9", latency_s=2.5, settings_hash=f"h{i % 2}"))
    return rows


@pytest.fixture
def store(tmp_path) -> RunStore:
    store = RunStore(str(tmp_path / "run"), StorageConfig())
    store.init_run_file()
    write_rows(store, "data", varied_rows(), per_file=32)
    write_rows(store, "failures", [failure_row("k0001", "engine_5xx"),
                                   failure_row("gone", "timeout")])
    write_rows(store, "rejects", [reject_row(1, "not valid JSON: x")])
    return store


def data_part_reads(monkeypatch, store: RunStore) -> list[str]:
    reads: list[str] = []
    real = store.read_part

    def read_part(path, columns=None, sha256=None):
        if "/data/" in path:
            reads.append(path)
        return real(path, columns, sha256)
    monkeypatch.setattr(store, "read_part", read_part)
    return reads


def figures(store: RunStore) -> dict:
    rep = report.build_report(store, caps=[6144, 8192], trainer_max_lengths=[2048])
    rep.pop("generated_at")
    return rep


def test_every_report_column_is_in_a_format_6_sidecar():
    assert set(report.REPORT_COLUMNS) <= SIDECAR_OWN | set(part_summary.STATS_COLUMNS)


def test_a_format_6_sidecar_holds_the_parts_values(store):
    path = store.part_paths("data")[0]
    with open(store.sidecar_loc("data", os.path.basename(path)).path, "rb") as f:
        summary = part_summary.decode(f.read(), "data", os.path.getsize(path), store.key_salt)
    assert summary.schema.metadata[b"format"] == b"6" and part_summary.has_stats(summary)
    assert pa.types.is_dictionary(summary.schema.field("category").type)
    rows = pa.array([0, 3, 5, 31])
    columns = report.REPORT_COLUMNS
    assert part_summary.stats(summary, rows, columns).equals(
        store.read_part(path, columns).take(rows))


def test_the_report_reads_no_data_part_and_equals_the_one_read_from_parts(store, monkeypatch):
    reads = data_part_reads(monkeypatch, store)
    from_sidecars = figures(store)
    assert reads == []
    assert from_sidecars["keys"] == 240 and from_sidecars["data_rows_all_versions"] == 275
    assert from_sidecars["failures"]["open"] == 1  # "gone"; k0001 is done
    for path in store.part_paths("data"):  # a run written by the previous raygen
        sidecar_as_format_3(store, "data", os.path.basename(path))
    index = RunIndex.open(store)
    assert "part" not in index.reads  # format 3 stays valid: no rebuild
    from_parts = figures(store)
    assert len(reads) == len(index.winners_by_part())  # read their columns instead
    assert from_parts == from_sidecars


def test_a_run_of_both_formats_reports_the_same(store, monkeypatch):
    whole = figures(store)
    paths = store.part_paths("data")
    for path in paths[::2]:  # upgraded mid-run: older parts' sidecars are format 3
        sidecar_as_format_3(store, "data", os.path.basename(path))
    reads = data_part_reads(monkeypatch, store)
    assert figures(store) == whole
    assert sorted(reads) == sorted(paths[::2])


def test_format_4_sidecars_answer_all_but_the_flags_which_their_parts_give(store, monkeypatch):
    """A run upgraded mid-way: its format-4 sidecars serve every statistic they hold; only
    integrity_flags (added by format 5) is read from their parts, and the report is the
    same."""
    whole = figures(store)
    paths = store.part_paths("data")
    for path in paths[1::2]:
        sidecar_as_format_4(store, "data", os.path.basename(path))
    columns: list = []
    real = store.read_part
    monkeypatch.setattr(store, "read_part", lambda path, cols=None, sha256=None: (
        columns.append((path, cols)), real(path, cols, sha256))[1])
    index = RunIndex.open(store)
    assert "part" not in index.reads  # a format-4 sidecar stays valid: no rebuild
    df, _ = report.load_latest(store, index)
    assert figures(store) == whole
    columns = [c for path, c in columns if "/data/" in path]
    assert columns and all(c == ["integrity_flags"] for c in columns), columns
    assert len(columns) == 2 * len(paths[1::2])  # twice: load_latest, then figures
    assert set(df.columns) == set(report.REPORT_COLUMNS)


def test_a_stale_sidecar_is_not_taken_for_the_report(store, monkeypatch):
    """A sidecar that no longer fits its part (another upload of that name) is never
    the report's source: the part is read."""
    whole = figures(store)
    index = RunIndex.open(store)
    path = store.part_paths("data")[1]
    index.sizes[path] += 1  # as if the part listed now were another upload
    reads = data_part_reads(monkeypatch, store)
    df, _ = report.load_latest(store, index)
    assert reads == [path] and len(df) == whole["keys"]
    assert set(df.columns) == set(report.REPORT_COLUMNS)


def test_format_5_sidecars_answer_the_setting_as_null_reading_no_part(store, monkeypatch):
    """A run upgraded mid-way: its parts predate the setting column, so their format-5
    sidecars answer it as nulls; the report reads no part and is the same."""
    whole, _ = report.load_latest(store)
    paths = store.part_paths("data")
    for path in paths[::2]:
        sidecar_as_format_5(store, "data", os.path.basename(path))
    reads = data_part_reads(monkeypatch, store)
    assert "part" not in RunIndex.open(store).reads  # a format-5 sidecar stays valid
    upgraded, _ = report.load_latest(store)
    assert reads == [] and upgraded["setting"].isna().all()
    assert upgraded.drop(columns="setting").equals(whole.drop(columns="setting"))


def test_the_report_splits_a_mix_by_setting(tmp_path):
    store = RunStore(str(tmp_path / "run"), StorageConfig())
    store.init_run_file()
    rows = [make_row(f"k{i}", setting="direct" if i % 4 == 0 else "think",
                     finish_reason="length" if i % 4 == 0 else "stop",
                     completion_tokens=100 if i % 4 == 0 else 900) for i in range(40)]
    write_rows(store, "data", rows, per_file=16)
    rep = report.build_report(store)
    assert {k: (g["rows"], g["truncated"], g["output_tokens"]["mean"])
            for k, g in rep["by_setting"].items()} == {"direct": (10, 10, 100),
                                                       "think": (30, 0, 900)}
    assert "## By sampling setting" in report.render_markdown(rep)
