"""job.regenerate every_turn through SGLang's real engine: round 2's prompt is rendered on
round 1's own output (the scripted model's answer, its reasoning dropped as Qwen3's
template drops earlier turns'), not on the source's assistant turn, and the replica's
span of that turn in the prompt ids is the answer through its end-of-turn token."""

from __future__ import annotations

import json

import pytest

from jobs.config import parse_config
from jobs.pipeline.settings import NEXT_TURN, RunMode
from jobs.runs.run import run_job
from serve_apps.chat_format import IM_END, render_prompt
from serve_apps.engines.simulator import tokenizer as tk
from tests.integration.helpers import NeverRaised, read, run
from tests.support import sglang_cpu

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_round_two_is_rendered_on_round_ones_own_output(real_config, tmp_path):
    rows = tmp_path / "p.jsonl"
    with open(rows, "w") as f:
        for i in range(2):
            f.write(json.dumps({"id": f"c{i}", "messages": [
                {"role": "user", "content": f"Q{i}?"},
                {"role": "assistant", "content": "the source's reply"},
                {"role": "user", "content": "And?"}]}) + "\n")
    tree = real_config(rows, job={"regenerate": "every_turn"})
    assert run(tree).status == "succeeded"
    second = run_job(parse_config(tree), RunMode(NEXT_TURN), stop_exc=NeverRaised)
    assert second.status == "succeeded", second.text
    data = read(tree, "data").sort_values(["key", "version"])
    assert list(data["version"]) == [0, 1, 0, 1]
    for _, row in data[data["version"] == 1].iterrows():
        first, own = list(row["turns"])
        assert list(first["output_token_ids"]) == sglang_cpu.OUTPUT_IDS  # SGLang's turn 1
        i = row["key"][1:]
        history = [{"role": "user", "content": f"Q{i}?"},
                   {"role": "assistant", "content": sglang_cpu.ANSWER},
                   {"role": "user", "content": "And?"}]
        assert list(row["prompt_token_ids"]) == tk.encode(render_prompt(history))
        span = list(row["prompt_token_ids"])[int(first["span_start"]):int(first["span_end"])]
        assert tk.decode(span, skip_special_tokens=False) == sglang_cpu.ANSWER + IM_END
        assert list(own["output_token_ids"]) == sglang_cpu.OUTPUT_IDS
        assert row["turn_stop"] == "complete"
