"""The trainer round trip (`raygen export --check-template`) on rows SGLang's real engine
wrote: the prompt ids SGLang tokenized, the 38 ids the scripted model sampled (EOS
included), re-rendered by the tokenizer a trainer would load. The model's own template
(`--check-template model`) ignores reasoning_content, Qwen3's rule adds newlines around
``</think>`` the model never wrote: both are refused; a template that renders the turn
as the model wrote it passes, and the export carries accept_length and category."""

from __future__ import annotations

import json

import pytest

from jobs import cli
from tests.integration.helpers import read, run, write_prompts, write_yaml
from tests.support.trainer_templates import QWEN3, ROUND_TRIP, tokenizer_dir

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 8


def test_the_check_passes_the_matching_template_and_refuses_the_others(real_config, tmp_path,
                                                                       capsys):
    prompts = write_prompts(tmp_path / "p.jsonl", ROWS)
    tree = real_config(prompts)
    assert run(tree).status == "succeeded"
    data = read(tree, "data").set_index("key")
    cfg = str(write_yaml(tmp_path / "run.yaml", tree))
    base = ["export", "--config", cfg, "--format", "conversations"]
    capsys.readouterr()

    ok = tmp_path / "ok"
    assert cli.main(base + ["--out", str(ok), "--extra-columns", "accept_length,category",
                            "--check-template", str(tokenizer_dir(tmp_path / "rt", ROUND_TRIP))]) == 0
    assert "template: 0 of 8 rows differ (0.00%, limit 1.00%: ok)" in capsys.readouterr().out
    manifest = json.loads((ok / "export.manifest").read_text())
    check = manifest["template_check"]
    assert (check["checked"], check["mismatched"], check["passed"]) == (ROWS, 0, True)
    assert check["end_of_turn_suffix"]["rows"] == ROWS   # "\n" after <|im_end|>
    records = [json.loads(line) for line in (ok / "part-00000.jsonl").read_text().splitlines()]
    assert len(records) == ROWS
    for r in records:  # no speculative decoding on the pool: accept_length is null
        assert (r["accept_length"], r["category"]) == (None, data.at[r["id"], "category"])

    # the scripted model's own tokenizer (engine.model_path): its template drops the reasoning
    own = tmp_path / "own"
    assert cli.main(base + ["--out", str(own), "--check-template", "model"]) == 1
    err = capsys.readouterr().err
    assert f"{ROWS} of {ROWS} rows (100.00%)" in err and f"(by kind: prompt {ROWS})" in err
    assert "(output offset -2)" in err and "pretokenized avoids this" in err
    assert not own.exists() or not any(own.iterdir())

    qwen = tmp_path / "qwen"
    argv = base + ["--out", str(qwen), "--check-template", str(tokenizer_dir(tmp_path / "q", QWEN3))]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert f"(by kind: output {ROWS})" in err and "(output offset 26)" in err
    assert cli.main(argv + ["--allow-template-mismatch"]) == 0
    forced = json.loads((qwen / "export.manifest").read_text())["template_check"]
    assert (forced["share"], forced["passed"], forced["allowed"]) == (1.0, False, True)
    assert sum(c["checked"] for c in forced["by_category"].values()) == ROWS
    assert set(forced["by_category"]) == set(data.category)
