"""The trainer round trip (`export --check-template`): records re-rendered with a real HF
tokenizer (the test models' tokenizer, the simulator's ids) against the ids a row holds,
as the scripted model on SGLang writes them (tests/support/sglang_cpu.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.analysis import export as ex
from jobs.analysis.template_check import TemplateCheck
from serve_apps.engines.sglang_cpu import models
from serve_apps.engines.simulator import tokenizer as tk
from tests.support import sglang_cpu
from tests.support.run_rows import make_row, write_rows
from tests.support.trainer_templates import QWEN3, ROUND_TRIP, tokenizer_dir

# The scripted model's tokenizer and transformers' chat templates: the SGLang set.
pytestmark = pytest.mark.sglang_set


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tokenizers")
    return {"round_trip": str(tokenizer_dir(root / "rt", ROUND_TRIP)),
            "qwen3": str(tokenizer_dir(root / "qwen3", QWEN3)),
            "stock": str(tokenizer_dir(root / "stock"))}


def scripted_row(key: str, category: str = "chat", question: str | None = None, **over):
    """A row as the scripted model on SGLang writes it (tests/integration/sglang/test_job.py)."""
    messages = [{"role": "user", "content": question or f"Question {key}?"}]
    row = dict(messages=json.dumps(messages), category=category,
               prompt_token_ids=sglang_cpu.chat_ids(messages[0]["content"]),
               output_token_ids=sglang_cpu.OUTPUT_IDS, reasoning=sglang_cpu.REASONING,
               answer=sglang_cpu.ANSWER, finish_reason="stop", matched_stop=str(tk.EOS_ID))
    row.update(over)
    return make_row(key, **row)


def check(tokenizers, name: str, **kw) -> TemplateCheck:
    return TemplateCheck.load(tokenizers[name], **kw)


def test_the_matching_template_passes_and_the_export_is_written(store, tmp_path, tokenizers):
    write_rows(store, "data", [scripted_row(f"k{i}", "coding" if i % 2 else "chat")
                               for i in range(6)], per_file=4)
    manifest = ex.export(store, str(tmp_path / "out"), "conversations",
                         template=check(tokenizers, "round_trip"))
    r = manifest["template_check"]
    assert (r["checked"], r["mismatched"], r["share"], r["passed"]) == (6, 0, 0.0, True)
    assert r["kinds"] == {} and r["tokenizer"] == tokenizers["round_trip"]
    # the template's "\n" after <|im_end|>: generation ends at the stop token
    assert r["end_of_turn_suffix"] == {"rows": 6, "text": "\n"}
    assert {c: v["checked"] for c, v in r["by_category"].items()} == {"chat": 3, "coding": 3}
    assert manifest["rows"] == 6 and len(manifest["files"]) == 1
    assert "template: 0 of 6 rows differ (0.00%, limit 1.00%: ok)" in ex.render(manifest)


def test_a_template_that_adds_newlines_around_think_end_is_refused(store, tmp_path, tokenizers):
    write_rows(store, "data", [scripted_row(f"k{i}", "math" if i < 2 else "chat")
                               for i in range(5)])
    out = tmp_path / "out"
    ex.export(store, str(out), "conversations")  # an earlier export in the folder
    with pytest.raises(ex.ExportError) as info:
        ex.export(store, str(out), "conversations", template=check(tokenizers, "qwen3"))
    message = str(info.value)
    assert "5 of 5 rows (100.00%) re-render to other ids" in message
    assert "(by kind: output 5), over --max-template-mismatch 0.01; nothing written" in message
    assert "--format pretokenized avoids this" in message and "--allow-template-mismatch" in message
    # one example per category, decoded at the first difference
    assert "math: 2/2 (100.0%); e.g. k0 (output)" in message
    assert "chat: 3/3 (100.0%); e.g. k2 (output)" in message
    assert list(out.iterdir()) == [], "no manifest and no shard, old or new, is left"


def test_the_first_difference_is_located_and_decoded(store, tmp_path, tokenizers):
    write_rows(store, "data", [scripted_row("k0")])
    t = check(tokenizers, "qwen3", allow=True)
    manifest = ex.export(store, str(tmp_path / "out"), "messages", template=t)
    r = manifest["template_check"]
    assert (r["share"], r["passed"], r["allowed"], manifest["rows"]) == (1.0, False, True, 1)
    e = r["by_category"]["chat"]["example"]
    prompt_len = len(sglang_cpu.chat_ids("Question k0?"))
    # the model closed its thinking right after "z"; Qwen3's rule puts "\n" first
    assert (e["kind"], e["output_offset"]) == ("output", len(sglang_cpu.REASONING))
    assert e["position"] == prompt_len + len(sglang_cpu.REASONING)
    assert (e["produced_id"], e["rendered_id"]) == (tk.THINK_END_ID, models.byte_id("\n"))
    assert e["produced"] == "stuvwxyz</think>ABCDEFG"
    assert e["rendered"] == "stuvwxyz\n</think>\n\nABCD"
    assert e["same_text"] is False
    assert "over the limit, written anyway (--allow-template-mismatch)" in ex.render(manifest)


def test_a_template_that_ignores_reasoning_content_differs_in_the_generation_prompt(
        store, tmp_path, tokenizers):
    write_rows(store, "data", [scripted_row("k0")])
    with pytest.raises(ex.ExportError, match=r"e.g. k0 \(prompt\) at id \d+ \(output offset -2\)"):
        ex.export(store, str(tmp_path / "out"), "conversations", template=check(tokenizers, "stock"))


def test_kinds_and_the_threshold(store, tmp_path, tokenizers):
    """With the matching template: 1 sound row, 1 cut at the budget (the template closes a
    turn the model did not), 1 stopped by a stop string (the text lost the "E" the model
    wrote), 1 sampled as word ids the tokenizer would spell as bytes."""
    cut = sglang_cpu.OUTPUT_IDS[:12]
    word = tk.WORD_BASE + tk.WORDS.index("stop")
    stop_e = sglang_cpu.OUTPUT_IDS[:27 + 5]      # a..z </think> A B C D E
    words = sglang_cpu.OUTPUT_IDS[:27] + [models.byte_id("A"), word, models.byte_id("B"), tk.EOS_ID]
    write_rows(store, "data", [
        scripted_row("sound"),
        scripted_row("cut", output_token_ids=cut, reasoning=sglang_cpu.REASONING[:12],
                     answer="", finished_thinking=False, finish_reason="length"),
        scripted_row("stop-e", output_token_ids=stop_e, answer="ABCD", matched_stop="E"),
        scripted_row("words", output_token_ids=words, answer="A stopB"),
    ])
    keep = ex.Filters(include_truncated=True)
    t = check(tokenizers, "round_trip", max_share=0.75)
    manifest = ex.export(store, str(tmp_path / "a"), "conversations", keep, template=t)
    r = manifest["template_check"]
    assert r["kinds"] == {"output": 2, "end_added": 1} and r["share"] == 0.75 and r["passed"]
    example = r["by_category"]["chat"]["example"]        # the first mismatched row read
    assert example["key"] == "cut" and example["output_offset"] == 12
    assert example["rendered"] == "efghijkl</think><|im_end|>\n"   # 8 ids either side
    with pytest.raises(ex.ExportError, match="3 of 4 rows"):
        ex.export(store, str(tmp_path / "b"), "conversations", keep,
                  template=check(tokenizers, "round_trip", max_share=0.7))
    # only what the export keeps is checked: without --include-truncated, 2 of 3 differ
    r = ex.export(store, str(tmp_path / "c"), "conversations",
                  template=check(tokenizers, "round_trip", allow=True))["template_check"]
    assert (r["checked"], r["mismatched"]) == (3, 2)


def test_same_text_different_ids_is_named(store, tmp_path, tokenizers):
    word = tk.WORD_BASE + tk.WORDS.index("stop")   # " stop", one id; the tokenizer spells 5
    ids = sglang_cpu.OUTPUT_IDS[:27] + [models.byte_id("A"), word, models.byte_id("B"), tk.EOS_ID]
    write_rows(store, "data", [scripted_row("words", output_token_ids=ids, answer="A stopB")])
    manifest = ex.export(store, str(tmp_path / "out"), "conversations",
                         template=check(tokenizers, "round_trip", allow=True))
    e = manifest["template_check"]["by_category"]["chat"]["example"]
    assert (e["kind"], e["produced_id"], e["rendered_id"]) == ("output", word, models.byte_id(" "))
    assert e["same_text"] is True   # " stop" either way: only the tokenization differs
    assert f"e.g. words (output) at id {e['position']} (output offset 28), same text" \
        in ex.render(manifest)


def test_rendered_ids_are_what_apply_chat_template_tokenize_true_gives(tokenizers):
    """The check renders per row and tokenizes in batches; the trainers call
    apply_chat_template(..., tokenize=True). The ids must be the same."""
    from transformers import AutoTokenizer
    tools = json.dumps([{"type": "function", "function": {"name": "wx"}}])
    rows = [scripted_row("a"), scripted_row("b", question="Ünïcødé ✓?", tools=tools)]
    for name in ("round_trip", "qwen3"):
        t = check(tokenizers, name)
        tok = AutoTokenizer.from_pretrained(tokenizers[name])
        for row in rows:
            turns = ex.chat_turns(row)
            direct = tok.apply_chat_template(turns, tools=json.loads(row["tools"] or "[]") or None,
                                             tokenize=True)
            direct = direct["input_ids"] if hasattr(direct, "keys") else direct
            assert t.encode([t.render_text(turns, row["tools"])])[0] == list(direct)


def test_a_template_that_raises_is_counted_as_a_render_error(store, tmp_path):
    folder = tokenizer_dir(tmp_path / "tok", "{{ raise_exception('no tools here') }}")
    write_rows(store, "data", [scripted_row("k0")])
    with pytest.raises(ex.ExportError, match=r"e\.g\. k0 \(render_error\): \w+: no tools here\n"):
        ex.export(store, str(tmp_path / "out"), "conversations",
                  template=TemplateCheck.load(str(folder)))
    r = ex.export(store, str(tmp_path / "out"), "conversations",
                  template=TemplateCheck.load(str(folder), allow=True))["template_check"]
    assert r["kinds"] == {"render_error": 1}
    assert r["by_category"]["chat"]["example"] == {
        "key": "k0", "kind": "render_error", "error": "TemplateError: no tools here"}


def test_pretokenized_is_refused_for_the_check(store, tmp_path, tokenizers):
    write_rows(store, "data", [scripted_row("k0")])
    with pytest.raises(ex.ExportError, match="pretokenized records are the sampled ids"):
        ex.export(store, str(tmp_path / "out"), "pretokenized",
                  template=check(tokenizers, "round_trip"))


# --- the flags ---------------------------------------------------------------------------

def cli_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:
        ex.main(argv)
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    return err


@pytest.mark.parametrize("extra, fmt, message", [
    (["--max-template-mismatch", "0.1"], "messages",
     "--max-template-mismatch needs --check-template TOKENIZER"),
    (["--allow-template-mismatch"], "messages",
     "--allow-template-mismatch needs --check-template TOKENIZER"),
    (["--check-template", "TOK"], "pretokenized", "--check-template applies to --format"),
    (["--check-template", "TOK", "--max-template-mismatch", "1.5"], "messages",
     "--max-template-mismatch must be within 0..1, got 1.5"),
    (["--check-template", "/no/such/tokenizer"], "messages",
     "--check-template /no/such/tokenizer: cannot load a tokenizer from this path"),
    (["--check-template", "model"], "messages", "--check-template model needs --config FILE"),
])
def test_flag_errors_are_one_line_naming_the_flag(store, tmp_path, capsys, tokenizers, extra,
                                                  fmt, message):
    write_rows(store, "data", [scripted_row("k0")])
    argv = [store.uri, "--format", fmt, "--out", str(tmp_path / "out")]
    err = cli_error(argv + [tokenizers["round_trip"] if a == "TOK" else a for a in extra], capsys)
    assert message in err and err.count("\n") == 1, err


def run_config(tmp_path: Path, engine: dict) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps({"engine": engine, "job": {
        "input": "prompts.jsonl", "output": str(tmp_path), "run_name": "run"}}))
    return str(path)


def test_model_is_the_configs_model_path(store, tmp_path, capsys, tokenizers):
    write_rows(store, "data", [scripted_row("k0")])
    cfg = run_config(tmp_path, {"kind": "sglang", "model_path": tokenizers["round_trip"]})
    assert ex.main([store.uri, "--config", cfg, "--format", "conversations", "--out",
                    str(tmp_path / "out"), "--check-template", "model"]) == 0
    assert f"template: 0 of 1 rows differ (0.00%, limit 1.00%: ok) with " \
           f"{tokenizers['round_trip']}" in capsys.readouterr().out
    sim = run_config(tmp_path, {"kind": "simulator", "model_path": "sim-qwen"})
    err = cli_error([store.uri, "--config", sim, "--format", "messages", "--out",
                     str(tmp_path / "o2"), "--check-template", "model"], capsys)
    assert "the config's engine is the simulator (sim-qwen)" in err


def test_the_cli_refusal_names_the_way_out(store, tmp_path, capsys, tokenizers):
    write_rows(store, "data", [scripted_row("k0")])
    argv = [store.uri, "--format", "messages", "--out", str(tmp_path / "out"),
            "--check-template", tokenizers["qwen3"]]
    err = cli_error(argv, capsys)
    assert "1 of 1 rows (100.00%)" in err and "pretokenized avoids this" in err
    assert not (tmp_path / "out" / ex.MANIFEST).exists()
    assert ex.main(argv + ["--max-template-mismatch", "1"]) == 0
    manifest = json.loads((tmp_path / "out" / ex.MANIFEST).read_text())
    assert manifest["template_check"]["passed"] and manifest["template_check"]["share"] == 1.0
