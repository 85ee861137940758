"""The `raygen` console script: installed, short help with examples and exit codes, the
run derived from --config, conflicting flags refused, errors as one line; and the
requires-python bound the pins need."""

from __future__ import annotations

import json
import tomllib
from importlib.metadata import distribution
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from jobs import cli
from jobs.config import StorageConfig
from jobs.io.run_store import RunStore
from jobs.io.storage import write_json_atomic
from tests.support.run_rows import make_row, write_rows

REPO = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def config_file(tmp_path: Path) -> Path:
    tree = {"job": {"input": str(tmp_path / "in.jsonl"), "output": str(tmp_path / "runs"),
                    "run_name": "r1"}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def local_run(tmp_path: Path) -> RunStore:
    store = RunStore(str(tmp_path / "runs" / "r1"), StorageConfig())
    write_rows(store, "data", [make_row("a"), make_row("b", finish_reason="length")])
    write_json_atomic(store.loc("progress.json"), {"status": "succeeded", "run": "r1",
                                                   "total": 2, "completed": 2})
    return store


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_each_subcommand_has_short_help_with_examples_and_exit_codes(command, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    text = capsys.readouterr().out
    assert info.value.code == 0
    assert "examples:" in text and "exit codes:" in text and f"raygen {command}" in text
    # export has a flag per filter and per check (--check-template & co.): one screen
    assert "Design decisions" not in text
    assert len(text.splitlines()) < (80 if command == "export" else 60)


def test_status_derives_the_run_from_the_config(tmp_path, capsys):
    local_run(tmp_path)
    assert cli.main(["status", "--config", str(config_file(tmp_path))]) == 0
    assert "status     succeeded" in capsys.readouterr().out


def test_export_with_config_alone_writes_the_runs_stop_rows(tmp_path, capsys):
    local_run(tmp_path)
    out = tmp_path / "exp"
    assert cli.main(["export", "--config", str(config_file(tmp_path)), "--format",
                     "pretokenized", "--out", str(out)]) == 0
    assert json.loads((out / "export.manifest").read_text())["rows"] == 1
    assert "exported 1 rows" in capsys.readouterr().out


def test_finalize_and_report_delegate_to_their_modules(tmp_path, capsys):
    store = local_run(tmp_path)
    cfg = str(config_file(tmp_path))
    assert cli.main(["finalize", "--config", cfg, "--rows-per-file", "1"]) == 0
    manifest = json.loads(Path(store.loc("final", "manifest.json").path).read_text())
    assert [f["rows"] for f in manifest["files"]] == [1, 1]
    assert cli.main(["report", store.uri, "--what-if", "8192"]) == 0
    assert Path(store.loc("report.json").path).exists()


@pytest.mark.parametrize("argv, code, message", [
    (["status"], 2, "give the run URI or --config FILE"),
    (["report", "ftp://host/run"], 1, "unsupported URI scheme"),
    (["finalize", str(Path("/nonexistent/run"))], 1, "no run at"),
])
def test_errors_are_one_line_with_their_exit_code(argv, code, message, capsys):
    assert cli.main(argv) == code
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_an_invalid_config_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("job: {input: a, output: o, run_name: r, max_new_tokens: -1}\n")
    assert cli.main(["status", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "job.max_new_tokens" in err and err.count("\n") == 1


@pytest.mark.parametrize("argv", [
    ["generate", "--config", "c.yaml", "--retry-failed", "--pilot", "5"],
    ["generate", "--config", "c.yaml", "--check-context", "--retry-failed"],
    ["continue", "--config", "c.yaml"],                        # no --max-total-tokens
    ["export", "RUN", "--format", "messages"],                 # no --out
    ["export", "RUN", "--format", "csv", "--out", "x"],
])
def test_conflicting_or_missing_flags_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2 and "error:" in capsys.readouterr().err


def test_generate_config_errors_keep_exit_2_through_the_cli(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("job: {input: a, output: o, run_name: r, sampling: {temprature: 1}}\n")
    assert cli.main(["generate", "--config", str(bad)]) == 2
    assert "job.sampling.temprature: unknown key" in capsys.readouterr().err


def _lowest_python(spec: str) -> tuple[int, int]:
    lows = [s.version for s in SpecifierSet(spec) if s.operator in (">=", "~=", "==")]
    return max(tuple(int(x) for x in v.split(".")[:2]) for v in lows)


def test_requires_python_admits_only_pythons_every_pin_supports():
    ours = PYPROJECT["project"]["requires-python"]
    low = _lowest_python(ours)
    pins = PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"][
        "test"]
    needs = {}
    for pin in pins:
        name = Requirement(pin).name
        spec = distribution(name).metadata.get("Requires-Python")
        if spec:
            needs[name] = _lowest_python(spec)
    assert low >= max(needs.values()), f"requires-python {ours}; the pins need {needs}"
    assert low == max(needs.values()), "requires-python is stricter than any pin needs"


def _options(parser) -> dict[str, tuple]:
    """Every option string of a parser, with what defines it (action, type, choices)."""
    return {opt: (type(a).__name__, a.type, a.choices, a.nargs)
            for a in parser._actions for opt in a.option_strings if opt != "-h" and opt != "--help"}


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_each_subcommand_has_exactly_its_modules_options(command):
    """`raygen X` and `python -m jobs...X` parse with options from one definition."""
    import argparse
    import importlib
    subs = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    raygen = _options(subs.choices[command])
    module_name, _ = cli.MODULES[command]
    module = importlib.import_module(module_name)
    standalone = argparse.ArgumentParser()
    module.add_args(standalone)  # what `python -m <module>` builds (its main)
    if command == "continue":  # python -m jobs.generate --continue-truncated ...
        assert raygen.keys() <= _options(standalone).keys()
        assert {k: v for k, v in _options(standalone).items() if k in raygen} == raygen
    else:
        assert raygen == _options(standalone)


def test_finalize_allow_partial_works_through_raygen(tmp_path, capsys):
    store = local_run(tmp_path)
    write_json_atomic(store.loc("progress.json"), {"status": "stopped", "run": "r1",
                                                   "total": 3, "completed": 2})
    cfg = str(config_file(tmp_path))
    assert cli.main(["finalize", "--config", cfg]) == 1
    assert "--allow-partial" in capsys.readouterr().err  # what the refusal tells the user ...
    assert cli.main(["finalize", "--config", cfg, "--allow-partial"]) == 0  # ... now works
    manifest = json.loads(Path(store.loc("final", "manifest.json").path).read_text())
    assert manifest["complete"] is False


def test_generate_module_refuses_conflicting_modes_like_raygen(capsys):
    from jobs import generate
    with pytest.raises(SystemExit) as info:
        generate.main(["--config", "c.yaml", "--retry-failed", "--continue-truncated"])
    assert info.value.code == 2 and "not allowed with" in capsys.readouterr().err
