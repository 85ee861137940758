"""job.regenerate every_turn: the turn assembly (jobs/pipeline/turns.py), why a
conversation stops, the rows a round writes, the loss mask over every assistant turn,
the settings_hash (last_turn pinned as before) and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from contract.protocol import GenerateResult
from jobs.analysis.export import chat_turns, pretokenized_lines, pretokenized_record
from jobs.config import ConfigError, parse_config
from jobs.io.run_index import RunIndex
from jobs.io.run_store import RunStore
from jobs.io.schema import DATA
from jobs.pipeline import turns
from jobs.pipeline.generate_stage import GenerateRows
from jobs.pipeline.rows import data_row, stopped_row
from jobs.pipeline.settings import NEXT_TURN, RunMode, StageSettings
from jobs.runs import plans, turn_rounds
from jobs.runs.errors import RunError
from tests.support.run_rows import make_row, write_rows

SIM = {"kind": "simulator", "model_path": "sim-m", "context_length": 16384}
CALL = {"id": "call_1", "type": "function", "function": {
    "name": "search_docs", "arguments": json.dumps({"query": "retry policy", "top_k": 3})}}
SOURCE = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "How does the job retry?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "content": "Exponential backoff, 4 attempts."},
    {"role": "assistant", "content": "It backs off exponentially."},
    {"role": "user", "content": "Suggest a safer setting."},
]
SAME_CALL = ('<tool_call>\n{"name": "search_docs", "arguments": {"query": "retry policy", '
             '"top_k": 3}}\n</tool_call>')


def _turn(answer: str, finish: str = "stop", reasoning: str = "thought") -> dict:
    return turns.new_turn(GenerateResult(key="k", reasoning=reasoning, answer=answer,
                                         finished_thinking=True, finish_reason=finish,
                                         output_token_ids=[7, 8], completion_tokens=2))


def _cfg(tmp_path: Path, **job) -> object:
    rows = tmp_path / "in.jsonl"
    rows.write_text(json.dumps({"id": "c1", "messages": SOURCE[1:]}) + "\n")
    return parse_config({"engine": SIM, "job": {
        "input": str(rows), "output": str(tmp_path / "runs"), "run_name": "r", **job}})


# --- assembly ---------------------------------------------------------------------------

def test_a_conversation_has_a_turn_per_assistant_message_and_the_last_reply():
    assert turns.turn_count(SOURCE) == 3
    assert turns.turn_count([{"role": "user", "content": "hi"}]) == 1


def test_turn_k_is_generated_on_the_source_before_it_with_the_models_own_earlier_turns():
    assert turns.prompt_messages(SOURCE, []) == SOURCE[:2]
    first = _turn("Let me look.\n" + SAME_CALL)
    second = turns.prompt_messages(SOURCE, [first])
    assert second[:2] == SOURCE[:2] and second[3] == SOURCE[3]  # user and tool: the source's
    assert second[2] == {"role": "assistant", "content": "Let me look.",  # the model's, with
                         "reasoning_content": "thought", "tool_calls": [CALL]}  # source ids
    third = turns.prompt_messages(SOURCE, [first, _turn("Backoff, mine.")])
    assert third[4] == {"role": "assistant", "content": "Backoff, mine.",
                        "reasoning_content": "thought"}
    assert third[5] == SOURCE[5] and len(third) == 6
    with pytest.raises(ValueError, match="3 turns; all are done"):
        turns.prompt_messages(SOURCE, [first, first, first])


@pytest.mark.parametrize("done, stop", [
    ([_turn(SAME_CALL)], None),                                   # same call: go on
    ([_turn("no tools needed")], turns.TOOL_CALLS_DIFFER),        # made none
    ([_turn(SAME_CALL.replace("retry policy", "backoff"))], turns.TOOL_CALLS_DIFFER),
    ([_turn(SAME_CALL + SAME_CALL)], turns.TOOL_CALLS_DIFFER),    # one call too many
    ([_turn("<tool_call>not json</tool_call>")], turns.TOOL_CALLS_DIFFER),
    ([_turn(SAME_CALL), _turn("fine")], None),
    ([_turn(SAME_CALL), _turn(SAME_CALL)], turns.TOOL_CALLS_DIFFER),  # source made none
    ([_turn(SAME_CALL, finish="length")], turns.LENGTH),          # cut: stops there
    ([_turn(SAME_CALL), _turn("fine"), _turn("done")], turns.COMPLETE),
    ([_turn(SAME_CALL), _turn("fine"), _turn("cut", finish="length")], turns.LENGTH),
])
def test_a_conversation_stops_at_a_cut_turn_or_other_tool_calls_and_when_complete(done, stop):
    assert turns.stop_after(SOURCE, done) == stop


def test_the_regenerated_conversation_holds_only_the_models_assistant_turns():
    done = [_turn("Checking.\n" + SAME_CALL), _turn("Mine.")]
    messages = turns.conversation(SOURCE, done)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool",
                                             "assistant"]
    assert messages[2]["content"] == "Checking." and messages[4]["content"] == "Mine."
    row = {"messages": json.dumps(SOURCE), "turns": done, "answer": "x", "reasoning": "y"}
    assert chat_turns(row)[-1] == {"role": "assistant", "content": "Mine.",
                                   "reasoning_content": "thought"}


# --- rows -------------------------------------------------------------------------------

def test_a_round_writes_the_next_version_with_every_turn_and_their_spans(tmp_path):
    stage = StageSettings.of(_cfg(tmp_path, regenerate="every_turn"), RunMode(NEXT_TURN))
    assert stage.every_turn and stage.next_turn
    first = _turn(SAME_CALL)
    row = make_row("c1", version=0, messages=json.dumps(SOURCE), turns=[first])
    actor = GenerateRows.__new__(GenerateRows)  # its __init__ looks up a Serve handle
    actor.stage, actor.category_label = stage, str
    request = actor._request(row)
    assert request.messages == turns.prompt_messages(SOURCE, [first])
    assert request.assistant_spans
    result = GenerateResult(key="c1", reasoning="r2", answer="two", finished_thinking=True,
                            finish_reason="stop", output_token_ids=[9], completion_tokens=1,
                            prompt_token_ids=list(range(40)), max_new_tokens=4096,
                            assistant_spans=[[20, 30]])
    out = actor._data_row(row, result, 1)
    assert out["version"] == 1 and out["turn_stop"] is None
    assert [t["answer"] for t in out["turns"]] == [SAME_CALL, "two"]
    assert (out["turns"][0]["span_start"], out["turns"][0]["span_end"]) == (20, 30)
    assert out["turns"][1]["span_start"] is None  # the last turn is the row's output
    assert out["answer"] == "two" and out["messages"] == json.dumps(SOURCE)
    pa.Table.from_pylist([{k: v for k, v in out.items() if k in DATA.names}], schema=DATA)
    with pytest.raises(ValueError, match="found 0 assistant turns in the prompt, the row "
                                         "holds 1"):
        actor._data_row(row, GenerateResult(key="c1", answer="x", finish_reason="stop",
                                            output_token_ids=[1], max_new_tokens=9), 1)
    stopped = stopped_row(dict(row, __index=3), "context_overflow", 1)
    assert (stopped["version"], stopped["turn_stop"], stopped["turns"]) == (
        1, "error:context_overflow", [first])


def test_turn_one_of_a_fresh_session_is_the_prefix_before_the_first_assistant(tmp_path):
    stage = StageSettings.of(_cfg(tmp_path, regenerate="every_turn"))
    row = {"key": "c1", "id": "c1", "category": "c", "messages": json.dumps(SOURCE),
           "tools": None}
    actor = GenerateRows.__new__(GenerateRows)
    actor.stage, actor.category_label = stage, str
    request = actor._request(row)
    assert request.messages == SOURCE[:2] and not request.assistant_spans
    result = GenerateResult(key="c1", answer="plain", reasoning="r", finish_reason="stop",
                            finished_thinking=True, output_token_ids=[1],
                            max_new_tokens=4096)
    out = actor._data_row(row, result, 1)
    assert out["version"] == 0 and out["turn_stop"] == turns.TOOL_CALLS_DIFFER
    last = StageSettings.of(_cfg(tmp_path))
    actor.stage = last
    assert actor._request(row).messages == SOURCE  # last_turn: as today
    assert "turns" not in data_row(row, result, last, 1)


# --- loss mask --------------------------------------------------------------------------

def test_the_loss_mask_covers_every_assistant_turn_and_the_output():
    earlier = [dict(_turn("a"), span_start=2, span_end=4), dict(_turn("b"), span_start=6,
                                                                span_end=7), _turn("c")]
    assert turns.loss_mask(8, 3, earlier) == [0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1]
    assert turns.loss_mask(3, 2, None) == [0, 0, 0, 1, 1]
    rows = [{"key": "c1", "prompt_token_ids": list(range(8)), "output_token_ids": [8, 9, 10],
             "turns": earlier},
            {"key": "c2", "prompt_token_ids": [1, 2], "output_token_ids": [3], "turns": None}]
    table = pa.Table.from_pylist(rows, schema=pa.schema(
        [DATA.field("key"), DATA.field("prompt_token_ids"), DATA.field("output_token_ids"),
         DATA.field("turns")]))
    lines = [json.loads(line) for line in pretokenized_lines(table)]
    assert lines[0]["loss_mask"] == [0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1]
    assert lines[0]["input_ids"] == list(range(11))
    assert lines[1] == pretokenized_record(rows[1]) == {"id": "c2", "input_ids": [1, 2, 3],
                                                        "loss_mask": [0, 0, 1]}


# --- settings and refusals --------------------------------------------------------------

def test_last_turn_keeps_every_hash_and_every_turn_has_its_own(tmp_path):
    default = StageSettings.of(parse_config({"engine": SIM, "job": {
        "input": "p.jsonl", "output": "/tmp/o", "run_name": "r", "max_new_tokens": 4096}}))
    assert default.settings_hash == "b5d40cf1a58cfc37"  # pinned before every_turn existed
    last = StageSettings.of(_cfg(tmp_path, regenerate="last_turn"))
    every = StageSettings.of(_cfg(tmp_path, regenerate="every_turn"))
    assert last.settings_hash == StageSettings.of(_cfg(tmp_path)).settings_hash
    assert every.settings_hash != last.settings_hash and not last.every_turn


def test_every_turn_with_several_samples_is_refused_naming_both_fields(tmp_path):
    with pytest.raises(ConfigError, match="job.regenerate every_turn with "
                                          "job.samples_per_prompt 4"):
        _cfg(tmp_path, regenerate="every_turn", samples_per_prompt=4)
    with pytest.raises(ConfigError, match="regenerate"):
        _cfg(tmp_path, regenerate="every_other_turn")


@pytest.mark.parametrize("mode, says", [
    (RunMode.of_flags(continue_truncated=True, max_total_tokens=8192), "--continue-truncated"),
    (RunMode.of_flags(regenerate_flagged=True), "regenerating condemned or flagged rows"),
])
def test_continuing_or_regenerating_an_every_turn_run_is_refused(tmp_path, mode, says):
    cfg = _cfg(tmp_path, regenerate="every_turn")
    store = RunStore.for_run(cfg.job.output, cfg.job.run_name, cfg.storage)
    with pytest.raises(RunError, match=f"job.regenerate every_turn.*{says}"):
        plans.plan(cfg, store, plans.input_locations(cfg), RunIndex.open(store), mode,
                   StageSettings.of(cfg, mode))


def test_a_round_sends_exactly_the_latest_rows_whose_conversation_goes_on(tmp_path):
    cfg = _cfg(tmp_path, regenerate="every_turn")
    stage = StageSettings.of(cfg, RunMode(NEXT_TURN))
    store = RunStore.for_run(cfg.job.output, cfg.job.run_name, cfg.storage)
    store.init_run_file()
    one = [_turn("x")]
    rows = [make_row("open", 0, turns=one, settings_hash=stage.settings_hash),
            make_row("open", 1, turns=one * 2, settings_hash=stage.settings_hash),
            make_row("done", 0, turns=one, turn_stop="complete",
                     settings_hash=stage.settings_hash),
            make_row("went-on", 0, turns=one, settings_hash=stage.settings_hash),
            make_row("went-on", 1, turns=one * 2, turn_stop="length",
                     settings_hash=stage.settings_hash)]
    write_rows(store, "data", rows, per_file=2)
    found = turn_rounds.open_rows(store, RunIndex.open(store), stage.settings_hash)
    picked = [(path, r) for path, rs in found.items() for r in rs]
    assert len(picked) == 1
    path, r = picked[0]
    got = store.read_part(path).take(pa.array([r])).to_pylist()[0]
    assert (got["key"], got["version"]) == ("open", 1)
    assert turn_rounds.pending(store, stage.settings_hash) == 1
    counts = turn_rounds.stop_counts(store, RunIndex.open(store))
    assert counts == {None: 1, "complete": 1, "length": 1}  # each key's latest row once
    assert turn_rounds.stops_line(counts) == (
        "  every turn: conversations 1 complete, 1 length, 1 open")
    with pytest.raises(RunError, match="1 open conversations were generated with other "
                                       "settings"):
        turn_rounds.open_rows(store, RunIndex.open(store), "other")
