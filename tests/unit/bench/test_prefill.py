"""The scale benchmark's pre-filled runs (bench/prefill.py) are real runs to the job:
its resume state reads every held row as done under the config's settings, and the
admission pass leaves exactly the new prompts to generate."""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow as pa

from bench.prefill import (COMPLETION_TOKENS, ROWS_PER_PART, cached_run, grown, input_file,
                           recorded_input, synthetic_run, upload_synthetic)
from bench.resume_scale import config_tree, settings_hash_of
from jobs.config import StorageConfig, parse_config
from jobs.io.run_store import RunStore
from jobs.io.sources import MAX_LINE_BYTES
from jobs.io.storage import locate
from jobs.pipeline import admission_cache
from jobs.pipeline.admission import admit_inputs
from jobs.runs.plans import check_settings
from jobs.io.part_summary import SERVED
from jobs.io.run_index import RunIndex, read_latest_stats

HELD, NEW = 600, 40


def _cfg(tmp_path):
    args = argparse.Namespace(time_scale=0.0, app_name="t", replicas=1, max_new_tokens=4096)
    return parse_config(config_tree(args, "http://unused", tmp_path, "scale-unit"))


def test_prefilled_run_resumes_to_exactly_the_new_rows(tmp_path):
    cfg = _cfg(tmp_path)
    sh = settings_hash_of(cfg)
    run = cached_run(tmp_path, HELD, cfg, sh, threads=2)
    store = RunStore(str(run), StorageConfig())
    assert len(store.part_paths("data")) == -(-HELD // ROWS_PER_PART)

    index = RunIndex.open(store)
    assert len(index.done) == HELD
    check_settings(index, sh, cfg.job.max_new_tokens, "scale-unit")  # raises on a mismatch
    full = input_file(tmp_path, HELD + NEW)
    admission = admit_inputs([locate(str(full), StorageConfig())], index, False,
                             lambda part: None)
    assert (admission.total, len(admission.table), admission.edited) == (HELD + NEW, NEW, 0)


def test_cached_run_is_reused(tmp_path):
    cfg = _cfg(tmp_path)
    first = cached_run(tmp_path, 10, cfg, settings_hash_of(cfg), threads=1)
    part = next((first / "data").iterdir())
    part.unlink()  # a rebuild would write it again
    assert cached_run(tmp_path, 10, cfg, settings_hash_of(cfg), threads=1) == first
    assert not part.exists()


def test_the_after_prefill_opens_from_its_compact_object_the_before_one_from_format_3(
        tmp_path):
    cfg = _cfg(tmp_path)
    sh = settings_hash_of(cfg)
    after = RunIndex.open(RunStore(str(cached_run(tmp_path, 300, cfg, sh, threads=1)),
                                   StorageConfig()))
    before_store = RunStore(str(cached_run(tmp_path, 300, cfg, sh, threads=1, index="before")),
                            StorageConfig())
    before = RunIndex.open(before_store)
    assert after.reads == {"compact": 1} and before.reads == {"sidecar": 2}
    assert after.done.tolist() == before.done.tolist() and len(after.done) == 300
    sidecars = sorted(Path(before_store.root.path, "index", "data").glob("*.arrow"))
    assert [pa.ipc.open_file(f.read_bytes()).schema.metadata[b"format"]
            for f in sidecars] == [b"3", b"3"]  # as the previous raygen wrote them


def test_a_resume_of_the_recorded_input_goes_on_from_its_admission_pass(tmp_path):
    cfg = _cfg(tmp_path)
    run = cached_run(tmp_path, HELD, cfg, settings_hash_of(cfg), threads=2)
    path = recorded_input(tmp_path, run, HELD)
    assert recorded_input(tmp_path, run, HELD) == path  # built once
    store = RunStore(str(run), StorageConfig())
    index = RunIndex.open(store)
    with grown(tmp_path, path, HELD, NEW) as resume_input:
        inputs = [locate(str(resume_input), StorageConfig())]
        assert resume_input.read_bytes() == input_file(tmp_path, HELD + NEW).read_bytes()
        recorded = admission_cache.load(store, inputs, None, MAX_LINE_BYTES, index)
        assert recorded is not None and recorded.reads == ["tail"]
        admission = admit_inputs(inputs, index, False, lambda part: None, recorded=recorded)
        assert (admission.total, len(admission.table)) == (HELD + NEW, NEW)
    assert path.read_bytes() == input_file(tmp_path, HELD).read_bytes()  # cut back


def test_a_synthetic_run_answers_a_resume_from_its_compact_objects_alone(tmp_path):
    cfg = _cfg(tmp_path)
    sh = settings_hash_of(cfg)
    run = synthetic_run(tmp_path, HELD, cfg, sh)
    store = RunStore(str(run), StorageConfig())
    index = RunIndex.open(store)
    assert index.reads == {"compact": 1}
    check_settings(index, sh, cfg.job.max_new_tokens, "scale-unit")
    assert len(index.done) == HELD and index.finish_counts() == {"stop": HELD}
    stats = pa.concat_tables(read_latest_stats(store, index, SERVED))
    assert index.reads["report_compact"] == len(store.part_paths("data"))
    assert "report_sidecar" not in index.reads and "report_part" not in index.reads
    assert stats.column("completion_tokens").to_pylist() == [COMPLETION_TOKENS] * HELD
    path = recorded_input(tmp_path, run, HELD)
    with grown(tmp_path, path, HELD, NEW) as resume_input:
        inputs = [locate(str(resume_input), StorageConfig())]
        recorded = admission_cache.load(store, inputs, None, MAX_LINE_BYTES, index)
        admission = admit_inputs(inputs, index, False, lambda part: None, recorded=recorded)
    assert recorded.reads == ["tail"] and (admission.total, len(admission.table)) == (
        HELD + NEW, NEW)
    # the upload leaves the sidecars out, the objects the resume reads in
    dest = tmp_path / "uploaded"
    upload_synthetic(run, str(dest), StorageConfig())
    assert not (dest / "index" / "data").exists()
    assert sorted(p.name for p in (dest / "index" / "compact").iterdir()) == [
        "00000001.arrow", "00000001.stats.arrow"]
    assert len(list((dest / "data").iterdir())) == len(store.part_paths("data"))
    assert RunIndex.open(RunStore(str(dest), StorageConfig())).done.tolist() == \
        index.done.tolist()
