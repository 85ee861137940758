"""A sampling mix with thinking off on the simulator engines (real Ray, moto S3), end to
end: each row's setting is the one jobs/pipeline/sampling_mix.py draws from its key and
the run's salt, recorded per row; the thinking-off rows were rendered with the empty
think block and hold their whole output as the answer, with no integrity flag, so
neither the replicas' drain nor the fleet-wide flag breaker stops a run that is mostly
thinking-off (before raygen knew thinking off, every such row was flagged
missing_think_end and the breaker's default 0.5 would have stopped it); the cut ones
are continued token for token without thinking; a resume with another mix is refused
before any engine is deployed; the report and the export split by setting."""

from __future__ import annotations

import copy
import json

import pytest

from jobs.analysis import export as ex
from jobs.pipeline.sampling_mix import draw
from jobs.runs.run import RunError
from serve_apps.engines.simulator import tokenizer as tk
from tests.integration.helpers import read, run, run_config, store_of, write_prompts

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # two sessions + a refused one
PROMPTS = 40
MIX = [{"name": "think", "weight": 1, "temperature": 0.6},
       {"name": "direct", "weight": 3, "temperature": 0.7, "top_p": 0.8, "thinking": False}]


def test_a_mostly_thinking_off_mix_runs_continues_reports_and_exports_by_setting(
        ray_cluster, s3_endpoint, tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", PROMPTS)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows),
                      job={"max_new_tokens": 512, "sampling": MIX})
    first = run(tree)
    assert first.status == "succeeded", first.text
    store = store_of(tree)
    data = read(tree, "data")
    assert len(data) == PROMPTS and read(tree, "failures").empty
    want = {k: ["think", "direct"][draw([1, 3], store.key_salt, k, None)] for k in data.key}
    assert dict(zip(data.key, data.setting)) == want
    assert set(want.values()) == {"think", "direct"}
    assert data.settings_hash.nunique() == 1  # the mix as a whole
    direct, think = data[data.setting == "direct"], data[data.setting == "think"]
    assert len(direct) > PROMPTS / 2
    for _, row in direct.iterrows():
        assert tk.decode(list(row.prompt_token_ids)).endswith("<think>\n\n</think>\n\n")
        assert row.reasoning == "" and row.reasoning_tokens == 0 and row.finished_thinking
        assert json.loads(row.sampling) == {"temperature": 0.7, "top_p": 0.8, "top_k": 20,
                                            "min_p": 0.0, "ignore_eos": False,
                                            "thinking": False}
        assert tk.THINK_END_ID not in list(row.output_token_ids)
    assert (direct.answer.str.len() > 0).all()
    assert not any(len(f) for f in data.integrity_flags)  # sound: nothing drained or tripped
    assert (think.reasoning.str.len() > 0).all()
    assert (direct.finish_reason == "stop").any() and (direct.finish_reason == "length").any()

    continued = run(tree, continue_truncated=True, max_total_tokens=4096)
    assert continued.status == "succeeded", continued.text
    after = read(tree, "data")
    latest = after.sort_values("version").drop_duplicates("key", keep="last").set_index("key")
    cut = direct[direct.finish_reason == "length"]
    for key, row in cut.set_index("key").iterrows():
        new = latest.loc[key]
        assert new.version == 1 and new.setting == "direct" and new.reasoning == ""
        assert list(new.output_token_ids)[:512] == list(row.output_token_ids)
        assert new.answer.startswith(row.answer) and not len(new.integrity_flags)
    assert dict(zip(latest.index, latest.setting)) == want  # each row kept its setting

    report = store.read_json("report.json")
    assert report["by_setting"]["direct"]["rows"] == len(direct)
    assert report["by_setting"]["think"]["rows"] == len(think)
    manifest = ex.export(store, str(tmp_path / "direct"), "messages",
                         ex.Filters(settings=("direct",), include_truncated=True),
                         extras=("setting",))
    assert manifest["rows"] == len(direct) and manifest["dropped"]["setting"] == len(think)

    other = copy.deepcopy(tree)
    other["job"]["sampling"][1]["weight"] = 1
    with pytest.raises(RunError, match="settings"):
        run(other)
