"""job.samples_per_prompt: settings_hash (n = 1 pinned as before), the admission pass's
expansion into (key, sample) identities decided alone against the run, the admit
stage's rows (sample, seed, a prompt's samples side by side), raising and lowering n,
the refusals, and the seed reaching the request."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from contract.config import ConfigError
from contract.protocol import GenerateResult
from jobs.config import parse_config
from jobs.io.digests import digests_of
from jobs.io.run_index import RunIndex, row_ids
from jobs.io.run_store import RunStore
from jobs.io.schema import DATA
from jobs.io.samples import SEED_FIELD, sample_digests, sample_seed
from jobs.pipeline.admit_stage import admit_batch
from jobs.pipeline.generate_stage import GenerateRows
from jobs.pipeline.rows import data_row, failure_row
from jobs.pipeline.settings import RunMode, StageSettings
from jobs.pipeline.validate import validate_batch
from jobs.runs import plans
from jobs.runs.errors import RunError
from tests.support.run_rows import failure_row as stored_failure, make_row, write_rows

SIM = {"kind": "simulator", "model_path": "sim-m", "context_length": 16384}
KEYS = [f"p{i}" for i in range(5)]


def _cfg(tmp_path: Path, n: int, **job) -> object:
    rows = tmp_path / "in.jsonl"
    if not rows.exists():
        rows.write_text("".join(json.dumps({"id": k, "messages": [
            {"role": "user", "content": f"q {k}"}]}) + "\n" for k in KEYS) + "not json\n")
    return parse_config({"engine": SIM, "job": {
        "input": str(rows), "output": str(tmp_path / "runs"), "run_name": "r",
        "max_reject_fraction": 0.9, "samples_per_prompt": n, **job}})


def _session(cfg, retry_failed: bool = False):
    """(the plan, its admission) of a fresh (or retry-failed) session on the run."""
    store = RunStore.for_run(cfg.job.output, cfg.job.run_name, cfg.storage)
    store.init_run_file()
    mode = RunMode.of_flags(retry_failed=retry_failed)
    stage, index = StageSettings.of(cfg, mode), RunIndex.open(store)
    admission = plans.admit(cfg, store, plans.input_locations(cfg), index, retry_failed,
                            lambda part: None, stage.samples_per_prompt)
    return plans.sample_total(admission), admission, store, stage


def _identities(store: RunStore, pairs) -> set[int]:
    return {int(sample_digests(digests_of([k], store.key_salt), s)[0]) for k, s in pairs}


def _held(store: RunStore, stage: StageSettings, pairs) -> None:
    """Data rows of these (key, sample) pairs, in parts named as the sink names them."""
    rows = [make_row(k, sample=s, seed=1, settings_hash=stage.settings_hash,
                     max_new_tokens=stage.max_new_tokens) for k, s in pairs]
    for at in range(0, len(rows), 4):
        table = pa.Table.from_pylist(rows[at:at + 4], schema=DATA)
        store.write_part("data", table, row_ids("data", table))


# --- settings ---------------------------------------------------------------------------

def test_one_sample_keeps_the_hash_of_existing_runs_and_more_share_one_hash(tmp_path):
    one, two, four = (StageSettings.of(_cfg(tmp_path, n)) for n in (1, 2, 4))
    default = StageSettings.of(parse_config({"engine": SIM, "job": {
        "input": "p.jsonl", "output": "/tmp/o", "run_name": "r", "max_new_tokens": 4096}}))
    assert default.settings_hash == "b5d40cf1a58cfc37"  # pinned before samples existed
    assert one.settings_hash == StageSettings.of(_cfg(tmp_path, 1)).settings_hash
    assert one.single_sample_hash == "" and one.samples_per_prompt == 1
    # seeded rows: another hash than one sample's; raising n keeps it (outputs do not
    # depend on n), so a run can add samples
    assert two.settings_hash == four.settings_hash != one.settings_hash
    assert four.single_sample_hash == one.settings_hash
    assert "sampling_seed" not in json.loads(four.sampling_json)  # per row, not per run


def test_greedy_sampling_with_several_samples_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match="job.samples_per_prompt .4. > 1 with "
                                          "job.sampling.temperature 0"):
        _cfg(tmp_path, 4, sampling={"temperature": 0})
    with pytest.raises(ConfigError, match="samples_per_prompt"):
        _cfg(tmp_path, 0)


# --- admission --------------------------------------------------------------------------

def test_a_fresh_run_admits_every_sample_of_every_valid_key(tmp_path):
    total, admission, store, _ = _session(_cfg(tmp_path, 4))
    assert total == 5 * 4 + 1  # progress counts (key, sample) rows + the reject
    assert len(admission.table) == 20 and admission.table.samples == 4
    assert set(admission.table.digests.tolist()) == _identities(
        store, [(k, s) for k in KEYS for s in range(4)])
    assert (admission.valid_keys, admission.held, admission.rejects) == (5, 0, 1)


def test_the_admit_stage_expands_each_row_into_its_samples_with_their_seeds(tmp_path):
    _, admission, store, _ = _session(_cfg(tmp_path, 3))
    lines = [json.dumps({"id": k, "messages": [{"role": "user", "content": f"q {k}"}]})
             for k in KEYS] + ["not json"]
    batch = validate_batch(pa.table({
        "source": ["in.jsonl"] * 6, "line": list(range(1, 7)),
        "ordinal": list(range(1, 7)), "raw": lines, "problem": [None] * 6}))
    out = admit_batch(batch, admission.table).to_pylist()
    assert [(r["key"], r["sample"]) for r in out] == [(k, s) for k in KEYS for s in range(3)]
    assert [r["seed"] for r in out] == [sample_seed(store.key_salt, r["key"], r["sample"])
                                        for r in out]
    assert len({r["seed"] for r in out}) == 15
    # a row at another ordinal (a later duplicate) is not admitted, in any sample
    moved = batch.set_column(2, "ordinal", pa.array(list(range(7, 13)), pa.int64()))
    assert admit_batch(moved, admission.table).num_rows == 0
    # n = 1: the table filters as before, no column added
    (tmp_path / "one").mkdir()
    _, one, _, _ = _session(_cfg(tmp_path / "one", 1))
    kept = admit_batch(batch, one.table)
    assert kept.column_names == batch.column_names and kept.num_rows == 5


def test_a_resume_sends_only_the_samples_the_run_lacks(tmp_path):
    cfg = _cfg(tmp_path, 4)
    _, _, store, stage = _session(cfg)
    _held(store, stage, [("p0", s) for s in range(4)] + [("p1", 0), ("p1", 2)])
    write_rows(store, "failures", [dict(stored_failure("p2", "engine_5xx"), sample=3)])
    total, admission, _, _ = _session(cfg)
    want = {(k, s) for k in KEYS for s in range(4)} - {("p0", s) for s in range(4)} \
        - {("p1", 0), ("p1", 2), ("p2", 3)}
    assert set(admission.table.digests.tolist()) == _identities(store, want)
    assert (admission.held, admission.failed_open, admission.removed) == (6, 1, 0)
    assert total == 21
    # --retry-failed: the failed sample alone
    _, retry, _, _ = _session(cfg, retry_failed=True)
    assert set(retry.table.digests.tolist()) == _identities(store, [("p2", 3)])


def test_raising_n_adds_the_missing_samples_and_lowering_it_keeps_the_extra_ones(tmp_path):
    cfg2 = _cfg(tmp_path, 2)
    _, _, store, stage = _session(cfg2)
    _held(store, stage, [(k, s) for k in KEYS for s in range(2)])
    _, raised, _, _ = _session(_cfg(tmp_path, 4))
    assert set(raised.table.digests.tolist()) == _identities(
        store, [(k, s) for k in KEYS for s in (2, 3)])
    _held(store, stage, [(k, s) for k in KEYS for s in (2, 3)])
    total, lowered, _, _ = _session(cfg2)
    # nothing to send; the samples 2-3 stay in the run, counted outside the input
    assert (len(lowered.table), lowered.held, lowered.removed, total) == (0, 10, 10, 11)


def test_n_above_one_on_a_run_of_one_sample_is_refused_before_any_pass(tmp_path):
    cfg1 = _cfg(tmp_path, 1)
    _, _, store, stage = _session(cfg1)
    _held(store, stage, [("p0", None)])
    cfg4 = _cfg(tmp_path, 4)
    with pytest.raises(RunError, match="holds 1 rows made with job.samples_per_prompt 1"):
        plans.plan(cfg4, store, plans.input_locations(cfg4), RunIndex.open(store), RunMode(),
                   StageSettings.of(cfg4))


# --- rows and requests ------------------------------------------------------------------

def test_rows_and_requests_carry_the_sample_and_its_seed(tmp_path):
    stage = StageSettings.of(_cfg(tmp_path, 4))
    row = {"key": "p1", "id": "p1", "category": "c", "source": "in.jsonl", "line": 2,
           "messages": '[{"role": "user", "content": "hi"}]', "tools": None,
           "sample": 2, "seed": 12345}
    result = GenerateResult(key="p1", output_token_ids=[1, 2], completion_tokens=2,
                            finish_reason="stop", max_new_tokens=8192, answer="a",
                            reasoning="r", finished_thinking=True)
    out = data_row(row, result, stage, attempts=1)
    assert (out["sample"], out["seed"]) == (2, 12345)
    assert failure_row(row, "engine_5xx", "boom", 4, stage)["sample"] == 2
    actor = GenerateRows.__new__(GenerateRows)  # its __init__ looks up a Serve handle
    actor.stage, actor.category_label = stage, str
    assert actor._request(row).sampling[SEED_FIELD] == 12345
    assert SEED_FIELD not in stage.sampling  # the run's own params stay unseeded
    one = dict(row, sample=None, seed=None)
    assert SEED_FIELD not in actor._request(one).sampling
    assert data_row(one, result, stage, 1)["sample"] is None
