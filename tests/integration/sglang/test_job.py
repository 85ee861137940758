"""The job end to end through SGLang's real engine: what raygen writes is what SGLang
decided, and with the scripted model that is known to the token.

Every row of a chat prompt must hold ``abc...z`` as reasoning and ``ABCDEFGHIJ`` as the
answer, end with EOS (``stop``, matched id 2) after 38 tokens, 27 of them reasoning by
SGLang's own count, with prompt ids equal to raygen's rendering through the model's
tokenizer; ``cached_tokens`` comes from SGLang's radix cache (the shared template
prefix; test_engine.py checks its exact count). A run cut at 12 tokens and continued to 64 equals the one-shot run token for
token, and with job.logprobs its logprobs (and top 5) are the one-shot request's exactly.
A sampling value raygen passes but SGLang refuses stops the run.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from jobs.runs.run import RunError
from serve_apps.engines.simulator import tokenizer as tk
from tests.integration.helpers import (assert_run_exact, read, run, store_of, write_prompts,
                                      write_yaml)
from tests.support import sglang_cpu

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 40
BAD_LINES = ['{"id": "broken", "messages": [', '{"id": "nomsg"}']


def _keys(n: int) -> list[str]:
    return [f"p{i:05d}" for i in range(n)]


def _latest(df):
    return df.sort_values("version").groupby("key").tail(1).set_index("key").sort_index()


@pytest.fixture(scope="module")
def one_shot(sglang_pool, s3_endpoint, tmp_path_factory):
    """ROWS prompts and two bad lines at the full budget (64 > the model's 38 tokens)."""
    from tests.integration.helpers import sglang_config
    tmp = tmp_path_factory.mktemp("sglang-job")
    rows = write_prompts(tmp / "p.jsonl", ROWS, extra_lines=BAD_LINES)
    # Two rows per Serve call: 20 calls, likelier to spread over both engines than the
    # default 16's three (the test does not rely on it: see below).
    tree = sglang_config(tmp, s3_endpoint, rows_file=str(rows), model_path=sglang_pool.model,
                         job={"rows_per_call": 2})
    return tree, run(tree), rows


def test_rows_are_what_the_real_engine_generated(one_shot, sglang_pool):
    tree, summary, rows = one_shot
    assert summary.status == "succeeded"
    assert_run_exact(tree, _keys(ROWS), BAD_LINES)
    df = read(tree, "data")
    assert len(df) == ROWS
    # Which engine serves a call is Serve's router's to decide (on a loaded machine its
    # cached queue lengths sent all 20 calls of a fresh-clone run to one engine): each
    # engine of the pool is asked directly for a row's prompt instead, and must answer
    # what the run wrote.
    first = df.iloc[0]
    for url in sglang_pool.urls:
        direct = sglang_cpu.output_ids(url, [int(t) for t in first.prompt_token_ids], budget=64)
        assert direct == [int(t) for t in first.output_token_ids], url
    prompts = {json.loads(line)["id"]: json.loads(line)["messages"]
               for line in rows.read_text().splitlines() if '"content"' in line}
    for row in df.itertuples():
        assert list(row.output_token_ids) == sglang_cpu.OUTPUT_IDS, row.key
        assert (row.reasoning, row.answer, row.finished_thinking) == \
            (sglang_cpu.REASONING, sglang_cpu.ANSWER, True)
        assert (row.finish_reason, row.matched_stop) == ("stop", str(tk.EOS_ID))
        assert row.completion_tokens == len(sglang_cpu.OUTPUT_IDS) == 38
        assert row.reasoning_tokens == sglang_cpu.REASONING_TOKENS   # SGLang's own count
        assert list(row.prompt_token_ids) == \
            sglang_cpu.chat_ids(prompts[row.id][0]["content"]), row.key
        assert row.prompt_tokens == len(row.prompt_token_ids)
        # The radix cache serves at most every prompt token but the last.
        assert 0 <= row.cached_tokens <= row.prompt_tokens - 1
        assert (row.model, row.budget_clamped_by) == (sglang_cpu.SERVED_NAME, "")
        assert pd.isna(row.spec_verify_ct) and pd.isna(row.accept_length)  # no speculation
        assert row.output_logprobs is None and row.output_top_logprobs is None  # not asked
    # Every prompt starts with the same template tokens: rows prefilled after an earlier
    # one finished reuse them from the radix cache (rows prefilled in the first batches,
    # before anything was cached, cannot: seen here, about half of them).
    assert (df.cached_tokens > 0).any(), df.cached_tokens.describe()
    assert summary.progress["completed"] == ROWS
    assert summary.progress["output_tokens"] == 38 * ROWS


def test_report_compare_puts_the_drafter_run_beside_a_plain_run_of_its_prompts(
        spec_run, one_shot, sglang_pool, tmp_path, capsys):
    """Evaluating a drafter on the real engine (docs/compare-drafters.md): the speculative
    pool's run and this module's plain run, which holds the same prompts and more, side by
    side with `raygen report --compare`. The drafter's side has the engine's own accept
    length (its rows' output tokens over their verify steps), the plain side none; greedy
    decoding verified by the target is the target's own output: the same tokens."""
    from jobs.analysis import report
    spec_tree, plain = spec_run[0], one_shot[0]
    assert report.main(["--config", str(write_yaml(tmp_path / "spec.yaml", spec_tree)),
                        "--compare", str(write_yaml(tmp_path / "plain.yaml", plain))]) == 0
    out = capsys.readouterr().out
    assert "## Compared with" in out
    with capsys.disabled():  # `-s` shows the table docs/compare-drafters.md quotes
        print("\n" + out[out.index("## Compared with"):].split("\nwrote ")[0])
    c = store_of(spec_tree).read_json("report.json")["compare"]
    spec_rows = sglang_cpu.SPEC_ROWS
    assert (c["shared"], c["only_in_run"], c["only_in_other"]) == (spec_rows, 0, ROWS - spec_rows)
    rows = read(spec_tree, "data")
    drafter, baseline = c["overall"]["run"], c["overall"]["other"]
    assert drafter["rows_with_verify_counts"] == spec_rows
    assert baseline["rows_with_verify_counts"] == 0
    assert drafter["accept_length"] == pytest.approx(
        rows["completion_tokens"].sum() / rows["spec_verify_ct"].sum(), rel=1e-3)
    assert drafter["accept_length"] > 1.0 and baseline["accept_length"] is None
    assert c["overall"]["accept_length_ratio"] is None  # nothing to divide by
    for side in (drafter, baseline):
        assert side["truncated"] == 0 and side["request_output_tok_per_s"] > 0
        assert side["mean_output_tokens"] == len(sglang_cpu.OUTPUT_IDS)
    assert sum(g["rows"] for g in c["by_category"].values()) == spec_rows
    # the drafter's run asked logprobs (top 5): with speculation they are still the
    # target's own, each output token's exactly what the plain engine gives one request
    for row in rows.itertuples():
        _assert_logprobs_of_one_shot(sglang_pool.urls[0], row, 5)


def test_stop_string_ends_the_row_where_sglang_matched_it(real_config, tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", 8)
    tree = real_config(rows, job={"sampling": {"temperature": 0.0, "stop": ["E"]}})
    assert run(tree).status == "succeeded"
    df = read(tree, "data")
    assert set(df.answer) == {"ABCD"} and set(df.matched_stop) == {"E"}
    assert set(df.finish_reason) == {"stop"}
    # the matched string is generated (its id is kept) but trimmed from the text
    assert set(df.completion_tokens) == {len(sglang_cpu.REASONING) + 1 + 5}
    assert all(list(ids)[-1] == tk.BYTE_BASE + ord("E") for ids in df.output_token_ids)


def _top_difference(got: dict[int, float], want: dict[int, float]) -> float:
    """The largest logprob difference of two top-N lists (id -> logprob): of the ids in
    both, and of an id in one only against the other's N-th (alternatives of equal
    logprob may change places, at the list's end too)."""
    worst = max((abs(got[t] - want[t]) for t in got.keys() & want.keys()), default=0.0)
    for mine, other in ((got, want), (want, got)):
        for t in mine.keys() - other.keys():
            worst = max(worst, abs(mine[t] - min(other.values())))
    return float(worst)


def _assert_logprobs_of_one_shot(url: str, row, top_k: int) -> None:
    """The row's logprobs (two versions' appended) are those SGLang gives one request
    for its whole output: exactly (float32, as SGLang computes them), the top lists as
    id -> logprob up to the order of equal ones."""
    body = sglang_cpu.one_shot(url, [int(t) for t in row.prompt_token_ids], 64, top_k)
    output = [int(t) for t in row.output_token_ids]
    assert body["output_ids"] == output
    meta = body["meta_info"]
    assert [e[1] for e in meta["output_token_logprobs"]] == output
    want = np.array([e[0] for e in meta["output_token_logprobs"]], np.float32)
    assert np.array_equal(np.asarray(row.output_logprobs, np.float32), want)
    tops = list(zip(row.output_top_logprob_ids, row.output_top_logprobs))
    assert len(tops) == len(meta["output_top_logprobs"]) == len(output)
    for (ids, lps), top in zip(tops, meta["output_top_logprobs"]):
        lps = np.asarray(lps, np.float32)
        assert len(ids) == top_k and np.all(np.diff(lps) <= 0)  # most likely first
        got = dict(zip((int(t) for t in ids), lps))
        assert _top_difference(got, {e[1]: np.float32(e[0]) for e in top}) == 0.0, (got, top)


def test_continued_rows_equal_the_one_shot_run(one_shot, real_config, sglang_pool):
    tree_full, _, rows = one_shot
    # job.logprobs on (top 5): the continuation appends its tokens' logprobs to the cut
    # version's, one per output token, equal to one request's (below)
    cut = real_config(rows, job={"max_new_tokens": 12, "logprobs": {"top_k": 5}})
    first = run(cut)
    assert first.progress["truncated"] == ROWS
    before = read(cut, "data")
    assert set(before.reasoning) == {sglang_cpu.REASONING[:12]}
    assert not before.finished_thinking.any() and set(before.finish_reason) == {"length"}
    assert all(len(lp) == len(ids) == 12 for lp, ids in zip(before.output_logprobs,
                                                             before.output_top_logprob_ids))

    summary = run(cut, continue_truncated=True, max_total_tokens=64)
    assert summary.status == "succeeded"
    cont, full = _latest(read(cut, "data")), _latest(read(tree_full, "data"))
    assert list(cont.index) == list(full.index) == _keys(ROWS)
    for key in full.index:
        assert list(cont.at[key, "output_token_ids"]) == list(full.at[key, "output_token_ids"])
        assert list(cont.at[key, "prompt_token_ids"]) == list(full.at[key, "prompt_token_ids"])
        for column in ("reasoning", "answer", "finish_reason", "matched_stop",
                       "completion_tokens", "reasoning_tokens"):
            assert cont.at[key, column] == full.at[key, column], (key, column)
    assert all(list(h) == [12, 64] for h in cont.budget_history)
    # The continuation resent prompt + output as ids: SGLang's radix cache still held
    # most of them (the 12 generated tokens and the prompt), on whichever engine.
    assert (cont.cached_tokens > 0).all()
    first = before.set_index("key")
    for key in _keys(ROWS)[:3]:
        assert np.array_equal(cont.at[key, "output_logprobs"][:12],
                              first.at[key, "output_logprobs"])  # kept as the cut row had them
        _assert_logprobs_of_one_shot(sglang_pool.urls[0], cont.loc[key], 5)


def test_a_sampling_value_sglang_refuses_stops_the_run(real_config, tmp_path):
    """top_k 0 passes raygen's config but SGLang answers 400 to every row: the breaker
    stops the run as misconfigured instead of writing a dataset of failures. (At
    temperature 0 SGLang accepts top_k 0: greedy sampling replaces it before the check;
    test_differential.py holds the simulator to the same.)"""
    rows = write_prompts(tmp_path / "p.jsonl", 30)
    tree = real_config(rows, job={"sampling": {"temperature": 0.6, "top_k": 0},
                                  "breaker": {"window_rows": 20, "min_rows": 10}})
    with pytest.raises(RunError) as info:
        run(tree)
    message = str(info.value)
    # SGLang's own words reach the user, with the error class
    assert "bad_request" in message and "top_k must be -1" in message, message
    assert store_of(tree).read_json("progress.json")["status"] == "failed"
    assert read(tree, "data").empty
    assert set(read(tree, "failures").error_class) <= {"bad_request"}
