"""Token-exact continuation: a run at 4096 continued to 8192 equals, row for row, a
run made at 8192 from the start, and spends only the extra tokens."""

from __future__ import annotations

import pytest

import pandas as pd

from jobs.analysis.finalize import finalize
from tests.integration.helpers import run_config, write_prompts
from tests.integration.helpers import read, run, store_of

pytestmark = pytest.mark.integration


def _latest(df):
    return df.sort_values("version").groupby("key").tail(1).set_index("key").sort_index()


def test_continue_truncated_equals_a_long_run(ray_cluster, s3_endpoint, tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", 100)
    short = run_config(tmp_path, s3_endpoint, rows_file=str(rows))
    long = run_config(tmp_path, s3_endpoint, rows_file=str(rows),
                      job={"max_new_tokens": 8192})
    run(short)
    before = read(short, "data")
    cut_before = before[before.finish_reason == "length"]
    assert len(cut_before) > 5, "the 4096 run should truncate some rows"

    summary = run(short, continue_truncated=True, max_total_tokens=8192)
    assert summary.status == "succeeded"
    # A continue session says what it wrote: new versions and the tokens they added.
    added = summary.progress["session_tokens_added"]
    assert f"session:   {len(cut_before)} rows written: {len(cut_before)} continued " \
        f"({added:+,} tokens)" in summary.text, summary.text
    assert summary.progress["session_new_versions"] == len(cut_before)
    assert summary.progress["session_new_prompts"] == 0
    long_summary = run(long)
    # the end-of-run summary counts each prompt once (its latest version)
    assert summary.text.split("finish:")[1].split("(")[0] == \
        long_summary.text.split("finish:")[1].split("(")[0]

    cont, ref = _latest(read(short, "data")), _latest(read(long, "data"))
    assert list(cont.index) == list(ref.index)
    for key in ref.index:
        assert list(cont.at[key, "output_token_ids"]) == list(ref.at[key, "output_token_ids"])
        assert cont.at[key, "finish_reason"] == ref.at[key, "finish_reason"]
        assert cont.at[key, "answer"] == ref.at[key, "answer"]
    continued = cont[cont.continuations > 0]
    assert set(continued.index) == set(cut_before.key)
    assert all(list(h) == [4096, 8192] for h in continued.budget_history)
    untouched = cont[cont.continuations == 0]
    assert (untouched.version == 0).all()
    # Spend: only the extra tokens were generated.
    extra = int(ref.completion_tokens.sum() - before.completion_tokens.sum())
    new_tokens = int((continued.completion_tokens - 4096).sum())
    assert new_tokens == extra == added  # what the summary said the session added

    # Idempotent: nothing left below 8192 that ended by length.
    again = run(short, continue_truncated=True, max_total_tokens=8192)
    assert again.progress["session_rows"] == 0
    assert len(read(short, "data")) == len(before) + len(continued)

    # finalize: exactly one row per prompt, the latest version of each.
    store = store_of(short)
    finalize(store, force=True)
    final = pd.concat([store.read_part(p).to_pandas()
                       for p in store.part_paths("final")], ignore_index=True)
    assert len(final) == 100 and final.key.is_unique
    latest = final.set_index("key").sort_index()
    assert (latest.version == cont.version).all()
