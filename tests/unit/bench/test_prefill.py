"""The scale benchmark's pre-filled runs (bench/prefill.py) are real runs to the job:
its resume state reads every held row as done under the config's settings, and the
admission pass leaves exactly the new prompts to generate."""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow as pa

from bench.prefill import ROWS_PER_PART, cached_run, input_file
from bench.resume_scale import config_tree, settings_hash_of
from jobs.config import StorageConfig, parse_config
from jobs.io.run_store import RunStore
from jobs.io.storage import locate
from jobs.pipeline.admission import admit_inputs
from jobs.runs.plans import check_settings
from jobs.io.run_index import RunIndex

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
