"""raygen tune's sample of the run's prompts (jobs/tune/prompts.py): valid rows only,
every category in it, as the generate stage sends them; one line when there is none."""

from __future__ import annotations

import json

import pytest

from jobs.config import parse_config
from jobs.tune.plan import TuneRefused
from jobs.tune.prompts import sample_prompts


def cfg_for(path) -> object:
    return parse_config({"engine": {"kind": "simulator", "model_path": "sim-x"},
                         "job": {"input": str(path), "output": "y", "run_name": "r"}})


def write(path, rows) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def test_a_stratified_sample_of_valid_prompts_with_their_tools(tmp_path):
    path = tmp_path / "in.jsonl"
    rows = [{"id": f"a{i}", "category": "chat",
             "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(90)]
    rows += [{"id": f"t{i}", "category": "tools", "messages": [{"role": "user", "content": "w"}],
              "tools": [{"type": "function", "function": {"name": "f"}}]} for i in range(10)]
    write(path, rows + ["{not json", {"id": "x", "messages": []}])
    got = sample_prompts(cfg_for(path), 20)
    cats = [r["category"] for r in got]
    assert len(got) == 20 and cats.count("tools") >= 2  # proportional, at least a few each
    tool = next(r for r in got if r["category"] == "tools")
    assert tool["tools"][0]["function"]["name"] == "f" and isinstance(tool["messages"], list)
    assert sample_prompts(cfg_for(path), 20) == got  # the same sample every time


def test_another_file_and_the_refusals(tmp_path):
    other = tmp_path / "other.jsonl"
    write(other, [{"messages": [{"role": "user", "content": "hi"}]}])
    assert sample_prompts(cfg_for(tmp_path / "missing.jsonl"), 5, str(other))[0]["messages"] \
        == [{"role": "user", "content": "hi"}]
    with pytest.raises(TuneRefused, match="job.input .*missing.jsonl: cannot be read"):
        sample_prompts(cfg_for(tmp_path / "missing.jsonl"), 5)
    bad = tmp_path / "bad.jsonl"
    write(bad, ["{nope", {"messages": []}])
    with pytest.raises(TuneRefused, match=r"no valid prompt to sample .* \(2 rows read, 2 "
                                          r"invalid; first: .*bad.jsonl row 1"):
        sample_prompts(cfg_for(bad), 5)
