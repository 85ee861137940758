"""Sampling mixes (job.sampling as a list) and thinking off: the config's refusals (each
naming its key), settings_hash (one setting pinned as before, the mix as a whole), the
draw (deterministic per identity and salt, near the weights, independent per sample),
the admit stage's setting column, and each row's request and data columns following
the setting it drew."""

from __future__ import annotations

import collections
import json

import numpy as np
import pyarrow as pa
import pytest

from contract.config import ConfigError
from contract.protocol import GenerateResult
from jobs.config import parse_config
from jobs.io.digests import digests_of
from jobs.pipeline.admission_table import AdmissionTable
from jobs.pipeline.admit_stage import admit_batch
from jobs.pipeline.modes import strategy
from jobs.pipeline.rows import continued_row, data_row
from jobs.pipeline.sampling_mix import draw, with_settings
from jobs.pipeline.settings import Mode, RunMode, StageSettings

BASE = {"input": ["in.jsonl"], "output": "/tmp/runs", "run_name": "r"}
MIX = [{"name": "think", "weight": 3, "temperature": 0.6},
       {"name": "direct", "weight": 1, "thinking": False, "temperature": 0.7, "top_p": 0.8}]
SALT = bytes(range(16))


def _cfg(**job):
    return parse_config({"job": {**BASE, **job}})


def _error(**job) -> str:
    with pytest.raises(ConfigError) as info:
        _cfg(**job)
    return str(info.value)


# --- config -----------------------------------------------------------------------------

@pytest.mark.parametrize("sampling, key, says", [
    ([], "job.sampling:", "an empty list"),
    ([{"name": "a", "weight": 0}], "job.sampling.0.weight:", "greater than 0"),
    ([{"name": "a", "weight": -2}], "job.sampling.0.weight:", "greater than 0"),
    ([{"name": "a"}, {"name": "b", "temprature": 1}], "job.sampling.1.temprature:",
     "unknown key"),
    ([{"weight": 1}], "job.sampling.0.name:", "Field required"),
    ([{"name": "a b"}], "job.sampling.0.name:", "letters, digits"),
    ([{"name": "a"}, {"name": "a"}], "job.sampling:", "names must be unique: a"),
    ({"thinking": False, "max_thinking_tokens": 64}, "job.sampling:", "thinking: false"),
    ({"name": "a"}, "job.sampling.name:", "unknown key"),  # a mapping is one setting
])
def test_an_invalid_setting_is_refused_naming_its_key(sampling, key, says):
    msg = _error(sampling=sampling)
    line = next(line for line in msg.splitlines() if key in line)
    assert says in line


def test_a_mix_checks_each_setting_as_the_run_does():
    msg = _error(samples_per_prompt=2, sampling=[{"name": "a"}, {"name": "g", "temperature": 0}])
    assert "job.sampling[g].temperature 0" in msg
    msg = _error(sampling=[{"name": "a"}, {"name": "b", "max_thinking_tokens": 8}])
    assert "job.sampling[b].max_thinking_tokens" in msg  # the default simulator: not strict


def test_the_main_setting_is_the_heaviest():
    cfg = _cfg(sampling=MIX)
    assert [s.name for s in cfg.job.settings] == ["think", "direct"]
    assert cfg.job.main_sampling.name == "think"
    assert "name" not in cfg.job.main_sampling.to_sglang()
    assert "weight" not in cfg.job.main_sampling.to_sglang()


# --- settings_hash ----------------------------------------------------------------------

def test_one_setting_keeps_the_settings_hash_it_had():
    """Pinned: the hashes main's code (before mixes) gives these configs. A live run's
    rows carry them; another hash would refuse its resume after the upgrade."""
    assert StageSettings.of(_cfg()).settings_hash == "37ad941ddd933d34"
    assert StageSettings.of(_cfg()).legacy_settings_hash == "57fb303a24e73ed5"
    t1 = _cfg(sampling={"temperature": 1.0, "top_p": 1.0, "top_k": -1})
    assert StageSettings.of(t1).settings_hash == "847a00ca17302481"
    n4 = StageSettings.of(_cfg(samples_per_prompt=4))
    assert (n4.settings_hash, n4.single_sample_hash) == ("b592bc15ed345a75", "37ad941ddd933d34")
    # thinking: true written out is the default: the same hash, the same params sent
    on = StageSettings.of(_cfg(sampling={"thinking": True}))
    assert on.settings_hash == "37ad941ddd933d34" and "thinking" not in on.sampling


def test_the_mix_as_a_whole_is_in_the_settings_hash():
    one = StageSettings.of(_cfg(sampling={"temperature": 0.6}))
    mix = StageSettings.of(_cfg(sampling=MIX))
    hashes = {one.settings_hash, mix.settings_hash}
    for changed in ([MIX[0], dict(MIX[1], weight=2)],          # a weight
                    [MIX[0], dict(MIX[1], name="plain")],       # a name
                    [MIX[1], MIX[0]],                           # the order
                    [MIX[0], dict(MIX[1], thinking=True)],      # thinking back on
                    [MIX[0]]):                                  # a setting dropped
        hashes.add(StageSettings.of(_cfg(sampling=changed)).settings_hash)
    assert len(hashes) == 7
    off = StageSettings.of(_cfg(sampling={"thinking": False}))
    assert off.settings_hash != one.settings_hash and off.sampling["thinking"] is False


# --- the draw ---------------------------------------------------------------------------

def test_the_draw_is_a_function_of_identity_and_salt_near_the_weights():
    keys = [f"k{i}" for i in range(4000)]
    drawn = [draw([3, 1], SALT, k, None) for k in keys]
    assert drawn == [draw([3, 1], SALT, k, None) for k in keys]  # every session alike
    assert [draw([3, 1], SALT, k, 0) for k in keys] == drawn     # sample 0 = no sample
    share = collections.Counter(drawn)[1] / len(keys)
    assert 0.22 < share < 0.28                                    # 1/4 by weight
    other_salt = [draw([3, 1], b"another-salt-16b", k, None) for k in keys]
    assert 0.3 < np.mean(np.array(other_salt) != np.array(drawn)) < 0.45  # drawn anew
    by_sample = [draw([3, 1], SALT, "k0", s) for s in range(400)]
    assert 0.18 < np.mean(by_sample) < 0.32                       # samples draw on their own
    assert {draw([1, 1, 1], SALT, k, None) for k in keys[:200]} == {0, 1, 2}


def _admitted(keys):
    digests = digests_of(keys, SALT)
    order = np.argsort(digests)
    return AdmissionTable(digests[order], np.arange(len(keys), dtype=np.int64)[order], SALT)


def test_the_admit_stage_names_each_row_s_setting_only_with_a_mix():
    keys = [f"k{i}" for i in range(50)]
    batch = pa.table({"key": keys, "ordinal": list(range(50)), "reject_reason": [None] * 50},
                     schema=pa.schema([("key", pa.string()), ("ordinal", pa.int64()),
                                       ("reject_reason", pa.string())]))
    mix = (("think", 3.0), ("direct", 1.0))
    out = admit_batch(batch, _admitted(keys), mix).to_pylist()
    assert [r["setting"] for r in out] == [["think", "direct"][draw([3, 1], SALT, k, None)]
                                           for k in keys]
    assert {r["setting"] for r in out} == {"think", "direct"}
    assert "setting" not in admit_batch(batch, _admitted(keys)).column_names
    sampled = batch.append_column("sample", pa.array([1] * 50, pa.int32()))
    assert with_settings(sampled, mix, SALT).column("setting").to_pylist() == [
        ["think", "direct"][draw([3, 1], SALT, k, 1)] for k in keys]


# --- requests and rows ------------------------------------------------------------------

ROW = {"key": "p1", "id": "p1", "category": "c", "source": "in.jsonl", "line": 2,
       "messages": '[{"role": "user", "content": "hi"}]', "tools": None}
RESULT = GenerateResult(key="p1", output_token_ids=[1, 2], completion_tokens=2,
                        finish_reason="length", max_new_tokens=8192, answer="a",
                        reasoning="", finished_thinking=True, reasoning_tokens=0,
                        effective_max_new_tokens=8192, prompt_token_ids=[7])


def test_each_row_is_sent_and_recorded_with_the_setting_it_drew():
    stage = StageSettings.of(_cfg(sampling=MIX))
    fresh = strategy(Mode.FRESH)
    direct = fresh.request(dict(ROW, setting="direct"), stage, "c")
    assert direct.sampling["thinking"] is False and direct.sampling["top_p"] == 0.8
    think = fresh.request(dict(ROW, setting="think"), stage, "c")
    assert "thinking" not in think.sampling and think.sampling["temperature"] == 0.6
    out = data_row(dict(ROW, setting="direct"), RESULT, stage, attempts=1)
    assert out["setting"] == "direct" and out["settings_hash"] == stage.settings_hash
    assert json.loads(out["sampling"]) == direct.sampling and out["integrity_flags"] == []
    with pytest.raises(ValueError, match="has setting None, not one of this run's sampling mix"):
        fresh.request(ROW, stage, "c")  # a mix row the admit stage did not draw


def test_a_continued_row_keeps_its_setting_and_thinking_off():
    stage = StageSettings.of(_cfg(sampling=MIX), RunMode.of_flags(
        continue_truncated=True, max_total_tokens=16000))
    base = dict(data_row(dict(ROW, setting="direct"), RESULT, stage, 1),
                version=0, continuations=0, budget_history=[8192], spec_verify_ct=None,
                latency_s=1.0)
    request = strategy(Mode.CONTINUE).request(base, stage, "c")
    assert request.sampling["thinking"] is False and request.input_ids == [7, 1, 2]
    out = continued_row(base, RESULT, stage, attempts=1)
    assert (out["setting"], out["reasoning_tokens"], out["version"]) == ("direct", 0, 1)


def test_one_setting_leaves_the_setting_column_null():
    stage = StageSettings.of(_cfg())
    assert stage.mix == () and data_row(ROW, RESULT, stage, 1)["setting"] is None
    off = StageSettings.of(_cfg(sampling={"thinking": False}))
    assert strategy(Mode.FRESH).request(ROW, off, "c").sampling["thinking"] is False
