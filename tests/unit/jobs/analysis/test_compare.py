"""jobs.analysis.compare (`raygen report RUN --compare OTHER`): two runs joined on the
prompts both hold, rows of one run only counted, each side's figures equal to pandas over
the shared rows; accept length per sampling setting; the errors naming the run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from jobs import cli
from jobs.analysis import compare, report
from jobs.config import StorageConfig
from jobs.io.run_store import RunStore
from jobs.io.storage import write_json_atomic
from tests.support.run_rows import make_row, write_rows

ROOT = Path(__file__).resolve().parents[4]


def new_store(tmp_path: Path, name: str) -> RunStore:
    return RunStore(str(tmp_path / "runs" / name), StorageConfig())


def drafted(key: str, category: str, tokens: int, verify: int, latency: float,
            finish: str = "stop", **over) -> dict:
    return make_row(key, category=category, completion_tokens=tokens, spec_verify_ct=verify,
                    latency_s=latency, finish_reason=finish, **over)


def new_and_baseline(tmp_path: Path) -> tuple[RunStore, RunStore]:
    """NEW (a better drafter: 4 tokens per verify on chat, 3 on code) and BASELINE (2 on
    both), over 6 shared prompts; NEW alone has n1, BASELINE alone has b1 and b2; "edited"
    is in both under another prompt; "c" is continued in BASELINE (version 1 counts)."""
    new = new_store(tmp_path, "new")
    write_rows(new, "data", [
        drafted("a", "chat", 800, 200, 4.0), drafted("b", "chat", 1200, 300, 6.0),
        drafted("c", "chat", 4096, 1024, 16.0, "length"),
        drafted("d", "code", 900, 300, 3.0), drafted("e", "code", 600, 200, 3.0),
        drafted("f", "code", 300, 100, 1.0),
        drafted("n1", "chat", 100, 10, 1.0),
        drafted("edited", "chat", 100, 50, 1.0, prompt_hash="sha256:new")], per_file=3)
    base = new_store(tmp_path, "base")
    write_rows(base, "data", [
        drafted("a", "chat", 1000, 500, 10.0), drafted("b", "chat", 1000, 500, 10.0),
        drafted("c", "chat", 4096, 2048, 40.0, "length"),
        drafted("c", "chat", 6000, 3000, 60.0, version=1, max_new_tokens=8192,
                budget_history=[4096, 8192]),
        drafted("d", "code", 900, 450, 9.0, "length"), drafted("e", "code", 600, 300, 6.0),
        drafted("f", "code", 300, 150, 3.0),
        drafted("b1", "math", 100, 50, 1.0), drafted("b2", "math", 100, 50, 1.0),
        drafted("edited", "chat", 100, 50, 1.0, prompt_hash="sha256:old")], per_file=4)
    return new, base


def by_pandas(rows: list[tuple]) -> dict:
    """(tokens, verify, latency, finish) of a set of rows -> the figures, by hand."""
    df = pd.DataFrame(rows, columns=["tokens", "verify", "latency", "finish"])
    return {"accept_length": df.tokens.sum() / df.verify.sum(),
            "truncated_fraction": (df.finish == "length").mean(),
            "mean_output_tokens": df.tokens.mean(),
            "request_output_tok_per_s": df.tokens.sum() / df.latency.sum()}


def assert_side(got: dict, want: dict) -> None:
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=0.005), k  # rounded to 2 decimals at most


def test_the_runs_are_joined_on_the_prompts_both_hold(tmp_path):
    new, base = new_and_baseline(tmp_path)
    c = compare.compare_runs(new, base)
    assert (c["shared"], c["only_in_run"], c["only_in_other"], c["prompt_differs"]) == (
        6, 1, 2, 1)
    assert (c["run"], c["other"]) == (new.uri, base.uri)
    assert list(c["by_category"]) == ["chat", "code"]  # math is BASELINE's alone
    assert c["overall"]["rows"] == 6
    assert c["by_category"]["chat"]["rows"] == c["by_category"]["code"]["rows"] == 3


def test_each_side_has_its_own_figures_over_the_shared_rows(tmp_path):
    new, base = new_and_baseline(tmp_path)
    c = compare.compare_runs(new, base)
    new_chat = [(800, 200, 4.0, "stop"), (1200, 300, 6.0, "stop"), (4096, 1024, 16.0, "length")]
    new_code = [(900, 300, 3.0, "stop"), (600, 200, 3.0, "stop"), (300, 100, 1.0, "stop")]
    base_chat = [(1000, 500, 10.0, "stop"), (1000, 500, 10.0, "stop"),
                 (6000, 3000, 60.0, "stop")]  # c's latest: continued, no longer cut
    base_code = [(900, 450, 9.0, "length"), (600, 300, 6.0, "stop"), (300, 150, 3.0, "stop")]
    chat, code, overall = c["by_category"]["chat"], c["by_category"]["code"], c["overall"]
    assert_side(chat["run"], by_pandas(new_chat))
    assert_side(chat["other"], by_pandas(base_chat))
    assert_side(code["run"], by_pandas(new_code))
    assert_side(code["other"], by_pandas(base_code))
    assert_side(overall["run"], by_pandas(new_chat + new_code))
    assert_side(overall["other"], by_pandas(base_chat + base_code))
    assert chat["run"]["accept_length"] == pytest.approx(6096 / 1524, abs=1e-3)
    assert chat["other"]["accept_length"] == pytest.approx(2.0, abs=1e-3)
    assert chat["accept_length_ratio"] == pytest.approx((6096 / 1524) / 2.0, abs=1e-3)
    assert code["accept_length_ratio"] == pytest.approx(3.0 / 2.0, abs=1e-3)
    assert (chat["run"]["truncated"], chat["other"]["truncated"]) == (1, 0)
    assert (code["run"]["truncated"], code["other"]["truncated"]) == (0, 1)


def test_rows_without_verify_counts_are_left_out_of_accept_length(tmp_path):
    """A run without speculative decoding has no accept length (and no ratio); a row
    without verify counts does not dilute the other rows' accept length."""
    spec, plain = new_store(tmp_path, "spec"), new_store(tmp_path, "plain")
    write_rows(spec, "data", [drafted("a", "chat", 900, 300, 3.0),
                              drafted("b", "chat", 500, None, 1.0)])
    write_rows(plain, "data", [drafted("a", "chat", 900, None, 9.0),
                               drafted("b", "chat", 500, None, 5.0)])
    c = compare.compare_runs(spec, plain)["overall"]
    assert c["run"]["accept_length"] == pytest.approx(3.0)
    assert c["run"]["rows_with_verify_counts"] == 1
    assert c["other"]["accept_length"] is None and c["accept_length_ratio"] is None
    assert c["other"]["request_output_tok_per_s"] == pytest.approx(1400 / 14.0)


def test_samples_are_their_own_prompts_in_the_join(tmp_path):
    a, b = new_store(tmp_path, "a"), new_store(tmp_path, "b")
    write_rows(a, "data", [drafted("k", "chat", 100, 50, 1.0, sample=0),
                           drafted("k", "chat", 300, 100, 1.0, sample=1)])
    write_rows(b, "data", [drafted("k", "chat", 200, 100, 1.0, sample=1),
                           drafted("k", "chat", 400, 100, 1.0, sample=2)])
    c = compare.compare_runs(a, b)
    assert (c["shared"], c["only_in_run"], c["only_in_other"]) == (1, 1, 1)
    assert c["overall"]["run"]["accept_length"] == pytest.approx(3.0)   # sample 1's
    assert c["overall"]["other"]["accept_length"] == pytest.approx(2.0)


def test_throughput_comes_from_progress_json_or_is_said_missing(tmp_path):
    new, base = new_and_baseline(tmp_path)
    write_json_atomic(new.loc("progress.json"),
                      {"gpu_hours": {"unit": "GPU-h", "output_tok_per_gpu_h": 7_200_000.0}})
    c = compare.compare_runs(new, base)
    assert c["throughput"]["run"]["output_tok_per_s_per_gpu"] == pytest.approx(2000.0)
    assert c["throughput"]["other"]["output_tok_per_s_per_gpu"] is None
    md = "\n".join(report._compare_md(c))
    assert "- Output tok/s per GPU: not recorded for the other (progress.json" in md
    write_json_atomic(base.loc("progress.json"),
                      {"gpu_hours": {"unit": "GPU-h", "output_tok_per_gpu_h": 3_600_000.0}})
    md = "\n".join(report._compare_md(compare.compare_runs(new, base)))
    assert ("- Output tok/s per GPU over the whole run (progress.json's output tokens per "
            "GPU-hour / 3,600: start-up and idle included, every prompt of the run): this run "
            "2,000.0, the other 1,000.0.") in md


def test_report_compare_prints_and_writes_the_section(tmp_path, capsys):
    new, base = new_and_baseline(tmp_path)
    assert report.main([new.uri, "--compare", base.uri]) == 0
    out = capsys.readouterr().out
    assert f"## Compared with {base.uri} (the prompts both runs hold)" in out
    assert ("6 prompts in both runs (joined on key and sample, the latest version of each); "
            "1 only in this run and 2 only in the other, left out; 1 with the same key but "
            "another prompt in each run, left out.") in out
    assert "| chat | 3 | 4.00 / 2.00 | 2.000x | 33.3 / 0.0 | 2,032.0 / 2,666.7 | " \
           "234.5 / 100.0 |" in out
    assert "| code | 3 | 3.00 / 2.00 | 1.500x | 0.0 / 33.3 | 600.0 / 600.0 | " \
           "257.1 / 100.0 |" in out
    # the doc's first example is this one (the simulator demo's follows it)
    doc = (ROOT / "docs" / "compare-drafters.md").read_text().split("### On the simulator demo")[0]
    table = [line for line in doc.splitlines()
             if line.startswith(("|  | shared rows", "| all |", "| chat |", "| code |"))]
    assert len(table) == 4 and all(line in out for line in table)
    on_disk = json.loads(Path(new.loc("report.json").path).read_text())
    assert on_disk["compare"]["shared"] == 6 and on_disk["compare"]["other"] == base.uri
    assert "## Compared with" in Path(new.loc("report.md").path).read_text()
    assert not Path(base.loc("report.json").path).exists()  # OTHER is only read


def config_naming(tmp_path: Path, run_name: str) -> Path:
    path = tmp_path / f"{run_name}.yaml"
    path.write_text(yaml.safe_dump({"job": {"input": str(tmp_path / "in.jsonl"),
                                            "output": str(tmp_path / "runs"),
                                            "run_name": run_name}}))
    return path


def test_other_may_be_named_by_its_config_like_the_run(tmp_path):
    """A YAML names <job.output>/<job.run_name>; a URI is the run itself."""
    new, base = new_and_baseline(tmp_path)
    assert compare.open_other(str(config_naming(tmp_path, "base")), None).uri == base.uri
    assert compare.open_other(base.uri, str(config_naming(tmp_path, "new"))).uri == base.uri


def test_a_missing_other_run_is_one_line_naming_it(tmp_path, capsys):
    new, _ = new_and_baseline(tmp_path)
    missing = str(tmp_path / "runs" / "nope")
    assert cli.main(["report", new.uri, "--compare", missing]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: --compare: no run at {missing} ") and err.count("\n") == 1
    assert cli.main(["report", new.uri, "--compare", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_runs_sharing_no_prompt_are_refused_naming_both(tmp_path, capsys):
    new, _ = new_and_baseline(tmp_path)
    other = new_store(tmp_path, "other")
    write_rows(other, "data", [drafted("x", "chat", 100, 50, 1.0),
                               drafted("edited", "chat", 100, 50, 1.0, prompt_hash="sha256:o")])
    with pytest.raises(compare.CompareError, match="1 with the same key but another prompt in each"):
        compare.compare_runs(new, other)
    assert cli.main(["report", new.uri, "--compare", other.uri]) == 1
    err = capsys.readouterr().err
    assert (f"error: runs {new.uri} (8 prompts) and {other.uri} (2 prompts) share no "
            f"prompts") in err and err.count("\n") == 1
    assert not Path(new.loc("report.json").path).exists()  # refused before any write


def test_an_other_run_without_rows_is_refused(tmp_path, capsys):
    new, _ = new_and_baseline(tmp_path)
    empty = new_store(tmp_path, "empty")
    write_json_atomic(empty.loc("progress.json"), {"status": "running"})
    assert cli.main(["report", new.uri, "--compare", empty.uri]) == 1
    assert (f"error: --compare: run {empty.uri} has no completed rows yet"
            in capsys.readouterr().err)


# --- accept length per sampling setting (a job.sampling mix) ------------------------------

def test_accept_length_is_split_by_sampling_setting(store):
    """think rows draft 4 tokens per verify, direct rows 2: the split gives each its own,
    the overall figure the sum over sum of both, and the markdown table shows them."""
    rows = [make_row(f"t{i}", setting="think", completion_tokens=800, spec_verify_ct=200)
            for i in range(6)]
    rows += [make_row(f"d{i}", setting="direct", completion_tokens=300, spec_verify_ct=150)
             for i in range(3)]
    rows += [make_row("d-plain", setting="direct", completion_tokens=999, spec_verify_ct=None)]
    write_rows(store, "data", rows, per_file=4)
    rep = report.build_report(store)
    by = rep["by_setting"]
    assert {k: (g["rows"], g["accept_length"]) for k, g in by.items()} == {
        "direct": (4, 2.0), "think": (6, 4.0)}
    assert rep["overall"]["accept_length"] == pytest.approx((6 * 800 + 900) / (6 * 200 + 450),
                                                            abs=1e-4)
    md = report.render_markdown(rep)
    section = md.split("## By sampling setting (job.sampling mix)", 1)[1].split("\n## ", 1)[0]
    accept = {cells[0]: cells[12] for cells in (
        [c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
        if line.startswith("| ") and not line.startswith("|  |"))}
    assert accept == {"direct": "2.00", "think": "4.00"}


def test_a_run_of_one_setting_has_no_setting_table(store):
    write_rows(store, "data", [make_row("a", spec_verify_ct=250)])
    rep = report.build_report(store)
    assert rep["by_setting"] == {}
    assert "## By sampling setting" not in report.render_markdown(rep)


# --- the recipe's commands exist ----------------------------------------------------------

def test_the_recipe_uses_only_flags_raygen_has():
    text = (ROOT / "docs" / "compare-drafters.md").read_text()
    commands = re.findall(r"^\s*(raygen \w+.*)$", text, flags=re.M)
    assert any("--compare" in c for c in commands)
    parser = cli.build_parser()
    subs = next(a for a in parser._actions if a.dest == "command").choices
    for command in commands:
        words = command.split()
        flags = {f for a in subs[words[1]]._actions for f in a.option_strings}
        used = {w.split("=")[0] for w in words[2:] if w.startswith("--")}
        assert used <= flags, (command, used - flags)
