"""jobs.runs.provenance: <run>/provenance.json, its parts, and what a resume says changed."""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from contract.redact import MASK
from jobs.config import parse_config
from jobs.io.run_store import RunStore
from jobs.pipeline.settings import RunMode, StageSettings
from jobs.runs import provenance

SIM_INFO = {"model_path": "sim-m", "served_model_name": "sim-m", "context_length": 16384,
            "max_running_requests": 32, "version": "sim-0.1", "port": 40001,
            "internal_states": [{"last_gen_throughput": 123.0}]}


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _tree(tmp_path: Path, **engine: Any) -> dict:
    return {"engine": {"kind": "simulator", "model_path": "sim-m", "context_length": 16384,
                       "max_running_requests": 32, **engine},
            "job": {"input": str(tmp_path / "in.jsonl"), "output": str(tmp_path / "runs"),
                    "run_name": "r", "sampling": {"temperature": 0.6, "top_p": 0.95}}}


def _sglang_tree(tmp_path: Path, model_path: str, **engine: Any) -> dict:
    tree = _tree(tmp_path)
    tree["engine"] = {"kind": "sglang", "model_path": model_path, "context_length": 16384,
                      "max_running_requests": 16, **engine}
    return tree


def _store(cfg) -> RunStore:
    return RunStore.for_run(cfg.job.output, cfg.job.run_name, cfg.storage)


class _Response:
    def __init__(self, value: Any):
        self.value = value

    def result(self, timeout_s: float | None = None) -> Any:
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value


class FakeHandle:
    """What run_job holds after deploy_or_attach: info() answers one replica's info."""

    def __init__(self, server_info: Any):
        outer = self

        class _Method:
            def remote(self):
                if isinstance(outer.server_info, BaseException):
                    return _Response(outer.server_info)
                return _Response({"replica": "x", "server_info": outer.server_info})
        self.server_info = server_info
        self.info = _Method()


def test_a_simulator_session_records_every_part(tmp_path):
    cfg = parse_config(_tree(tmp_path, speculative={"algorithm": "NEXTN"}))
    store = _store(cfg)
    store.root.fs.create_dir(store.root.path, recursive=True)
    inputs = {"files": [{"uri": "file:///in.jsonl", "size": 10, "rows": 3,
                         "sha256": "abc"}]}
    from jobs.io.storage import write_json_atomic
    write_json_atomic(store.loc("inputs.json"), inputs)
    rec = provenance.build(cfg, store, RunMode(), SIM_INFO)
    assert rec["format"] == 1 and rec["run"] == store.uri
    assert rec["model"] == {"path": "sim-m", "served_model_name": "sim-m",
                            "source": "simulator"}
    assert rec["settings_hash"] == StageSettings.of(cfg, RunMode()).settings_hash
    assert rec["sampling"] == cfg.job.sampling.to_sglang()
    assert (rec["sampling"]["temperature"], rec["sampling"]["top_p"]) == (0.6, 0.95)
    assert rec["speculative"]["algorithm"] == "NEXTN"
    assert rec["reasoning_parser"] == "qwen3" and rec["think_end_token"] == "</think>"
    assert rec["raygen"]["version"]  # importlib.metadata: raygen is installed
    assert rec["inputs"] == inputs["files"]
    engine = rec["engine"]
    assert engine["kind"] == "simulator" and engine["version"] == "sim-0.1"
    assert "internal_states" not in engine["server_info"]  # live state, not provenance
    argv = engine["argv"]
    assert argv[:3] == ["python", "-m", "serve_apps.engines.simulator"]
    assert argv[argv.index("--port") + 1] == "<port>"
    assert rec["chat_template"]["setting"] == "builtin"
    assert rec["chat_template"]["sha256"].startswith("sha256:")
    assert rec["session"]["mode"] == "fresh"
    assert rec["fingerprint"] == provenance.fingerprint(rec)


def test_a_local_model_folder_is_hashed_and_its_template_found(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    files = {"config.json": b'{"a": 1}', "tokenizer.json": b'{"t": 2}',
             "generation_config.json": b'{"g": 3}',
             "tokenizer_config.json": json.dumps({"chat_template": "{{ tc }}"}).encode()}
    for name, data in files.items():
        (model / name).write_bytes(data)
    (model / "model.safetensors").write_bytes(b"weights are not hashed")
    cfg = parse_config(_sglang_tree(tmp_path, str(model), chat_template="model",
                                    extra_args={"api-key": "s3cret", "random-seed": 7}))
    rec = provenance.build(cfg, _store(cfg), RunMode(), {})
    assert rec["model"]["source"] == "local_dir"
    assert rec["model"]["files"] == {n: _sha(d) for n, d in files.items()}
    assert rec["chat_template"] == {"setting": "model", "source": "tokenizer_config.json",
                                    "sha256": _sha(b"{{ tc }}")}
    argv = rec["engine"]["argv"]
    assert argv[argv.index("--api-key") + 1] == MASK and "s3cret" not in json.dumps(rec)
    assert argv[argv.index("--model-path") + 1] == str(model)
    # chat_template.jinja wins over tokenizer_config.json, as in transformers.
    (model / "chat_template.jinja").write_text("{{ jinja }}")
    rec = provenance.build(cfg, _store(cfg), RunMode(), {})
    assert rec["chat_template"]["source"] == "chat_template.jinja"
    assert rec["chat_template"]["sha256"] == _sha(b"{{ jinja }}")
    assert rec["model"]["files"]["chat_template.jinja"] == _sha(b"{{ jinja }}")


@pytest.mark.parametrize("path, source", [
    ("Qwen/Qwen3.6-27B", "hf_id"), ("/models/not/here", "path_not_on_driver")])
def test_a_model_not_on_the_driver_records_its_id(tmp_path, path, source):
    cfg = parse_config(_sglang_tree(tmp_path, path, chat_template="model"))
    rec = provenance.build(cfg, _store(cfg), RunMode(), {})
    assert rec["model"]["source"] == source and "files" not in rec["model"]
    assert rec["chat_template"]["sha256"] is None


def test_the_builtin_template_hash_follows_the_renderer(tmp_path, monkeypatch):
    engine = parse_config(_tree(tmp_path)).engine
    first = provenance.chat_template_fingerprint(engine)
    assert provenance.chat_template_fingerprint(engine) == first  # stable
    import serve_apps.chat_format as chat_format
    real = chat_format.render_prompt
    monkeypatch.setattr(chat_format, "render_prompt", lambda m, t=None: real(m, t) + " ")
    assert provenance.chat_template_fingerprint(engine)["sha256"] != first["sha256"]


def test_server_info_secrets_are_masked_and_live_state_dropped():
    info = {"api_key": "k1", "admin_api_key": None, "model_path": "m",
            "launch_command": "python -m sglang.launch_server --api-key k1 --port 3",
            "nested": {"hf_token": "k2", "ok": 1},
            "internal_states": [{"x": 1}]}
    clean = provenance.clean_server_info(info)
    text = json.dumps(clean)
    assert "k1" not in text and "k2" not in text
    assert clean["api_key"] == MASK and clean["admin_api_key"] is None  # unset stays unset
    assert clean["nested"] == {"hf_token": MASK, "ok": 1}
    assert "internal_states" not in clean and clean["model_path"] == "m"


def test_two_launches_of_a_real_sglang_engine_are_no_change(tmp_path):
    """/server_info of SGLang 0.5.23's CPU engine, launched twice with the same argv
    (tests/fixtures/server_info/): what differs is per launch, never a change."""
    data = json.loads((Path(__file__).resolve().parents[3] / "fixtures" / "server_info"
                       / "sglang-0.5.23_two_launches.json").read_text())
    first = data["launch_1"]
    second = {**first, **data["launch_2_changes"]}
    assert set(data["launch_2_changes"]) == {"launch_command", "port", "random_seed",
                                             "startup_time"}
    cfg = parse_config(_tree(tmp_path))
    a, b = (provenance.build(cfg, _store(cfg), RunMode(), info) for info in (first, second))
    assert provenance.diff(a, b) == [] and a["fingerprint"] == b["fingerprint"]
    assert a["engine"]["version"] == "0.5.23"
    assert a["engine"]["server_info"]["max_running_requests"] == 16
    assert a["engine"]["server_info"]["tbo_token_distribution_threshold"] == 0.48  # a number
    changed = dict(second, max_running_requests=8)
    c = provenance.build(cfg, _store(cfg), RunMode(), changed)
    assert provenance.diff(a, c) == [("engine.server_info.max_running_requests", 16, 8)]


def _two_records(tmp_path, **changes):
    cfg = parse_config(_tree(tmp_path))
    old = provenance.build(cfg, _store(cfg), RunMode(), SIM_INFO)
    tree = _tree(tmp_path)
    tree["engine"].update(changes)
    info = dict(SIM_INFO, port=40999, startup_time=1.5)  # per launch: never a change
    if "max_running_requests" in changes:
        info["max_running_requests"] = changes["max_running_requests"]
    new = provenance.build(parse_config(tree), _store(cfg), RunMode(), info)
    return old, new


def test_diff_names_each_changed_field_and_ignores_per_launch_values(tmp_path):
    old, new = _two_records(tmp_path)
    assert provenance.diff(old, new) == [] and old["fingerprint"] == new["fingerprint"]
    old, new = _two_records(tmp_path, max_running_requests=16)
    paths = [p for p, _, _ in provenance.diff(old, new)]
    assert "engine.server_info.max_running_requests" in paths
    assert "engine.argv" in paths and "engine.config_hash" in paths
    assert not any("port" in p or "startup" in p for p in paths)
    lines = provenance.describe(old, new)
    assert "settings_hash unchanged" in lines[0]
    assert "provenance: engine.argv: --max-running-requests 32 -> 16" in lines
    assert "provenance: engine.server_info.max_running_requests: 32 -> 16" in lines


def test_diff_of_inputs_is_per_file(tmp_path):
    old, _ = _two_records(tmp_path)
    old["inputs"] = [{"uri": "s3://b/in.jsonl", "rows": 3, "sha256": "a"}]
    new = copy.deepcopy(old)
    new["inputs"] = [{"uri": "s3://b/in.jsonl", "rows": 4, "sha256": "b"},
                     {"uri": "s3://b/more.jsonl", "rows": 1, "sha256": "c"}]
    changes = {p: (a, b) for p, a, b in provenance.diff(old, new)}
    assert changes['inputs["s3://b/in.jsonl"].rows'] == (3, 4)
    assert changes['inputs["s3://b/more.jsonl"].sha256'] == (None, "c")


def test_history_keeps_sessions_and_earlier_distinct_records(tmp_path):
    old, new = _two_records(tmp_path, max_running_requests=16)
    first = provenance.with_history(old, None)
    assert first["earlier"] == [] and len(first["sessions"]) == 1
    assert first["sessions"][0]["changed"] == []
    second = provenance.with_history(new, first)
    assert [e["fingerprint"] for e in second["earlier"]] == [old["fingerprint"]]
    assert "sessions" not in second["earlier"][0]
    assert "engine.argv" in second["sessions"][1]["changed"]
    same = provenance.build(parse_config(_tree(tmp_path, max_running_requests=16)),
                            _store(parse_config(_tree(tmp_path))), RunMode(),
                            dict(SIM_INFO, max_running_requests=16))
    third = provenance.with_history(same, second)
    assert len(third["earlier"]) == 1 and third["sessions"][2]["changed"] == []


def test_record_session_writes_and_logs_what_changed(tmp_path, caplog):
    cfg = parse_config(_tree(tmp_path))
    store = _store(cfg)
    with caplog.at_level(logging.INFO, logger="raygen"):
        provenance.record_session(cfg, store, RunMode(), FakeHandle(SIM_INFO))
    on_disk = store.read_json("provenance.json")
    assert on_disk["engine"]["server_info"]["version"] == "sim-0.1"
    assert not [r for r in caplog.records if "changed since" in r.getMessage()]
    caplog.clear()
    tree = _tree(tmp_path)
    tree["job"]["sampling"]["top_p"] = 0.95  # same: a settings_hash change is the plan's
    tree["engine"]["speculative"] = {"algorithm": "NEXTN", "num_draft_tokens": 4}
    with caplog.at_level(logging.WARNING, logger="raygen"):
        rec = provenance.record_session(parse_config(tree), store,
                                        RunMode.of_flags(retry_failed=True),
                                        FakeHandle(SIM_INFO))
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("provenance changed since the session of") for m in messages)
    assert 'provenance: speculative.algorithm: null -> "NEXTN"' in messages
    assert "provenance: speculative.num_draft_tokens: null -> 4" in messages
    assert rec["session"]["mode"] == "retry-failed" and len(rec["sessions"]) == 2
    assert store.read_json("provenance.json")["earlier"][0]["speculative"] is None


def test_an_engine_that_cannot_answer_info_does_not_stop_the_session(tmp_path, caplog):
    cfg = parse_config(_tree(tmp_path))
    with caplog.at_level(logging.WARNING, logger="raygen"):
        rec = provenance.record_session(cfg, _store(cfg), RunMode(),
                                        FakeHandle(TimeoutError("no answer")))
    assert rec["engine"]["server_info"] == {"error": "TimeoutError: no answer"}
    assert rec["engine"]["version"] is None
    assert any("/server_info could not be read" in r.getMessage() for r in caplog.records)


def test_a_record_of_another_format_is_kept_not_compared(tmp_path, caplog):
    cfg = parse_config(_tree(tmp_path))
    store = _store(cfg)
    store.root.fs.create_dir(store.root.path, recursive=True)
    from jobs.io.storage import write_json_atomic
    write_json_atomic(store.loc("provenance.json"), {"format": 99, "x": 1})
    with caplog.at_level(logging.WARNING, logger="raygen"):
        rec = provenance.record_session(cfg, store, RunMode(), FakeHandle(SIM_INFO))
    assert rec["earlier"] == [{"unreadable_format": 99, "record": {"format": 99, "x": 1}}]
    assert any("has format 99" in r.getMessage() for r in caplog.records)


def test_export_and_final_manifests_carry_a_copy(tmp_path):
    from jobs.analysis import export, finalize
    from tests.support.run_rows import make_row, write_rows
    cfg = parse_config(_tree(tmp_path))
    store = _store(cfg)
    write_rows(store, "data", [make_row("a"), make_row("b")])
    # Before any session recorded one (a run from an older raygen): null, said as such.
    assert export.export(store, str(tmp_path / "x0"), "pretokenized")["provenance"] is None
    rec = provenance.record_session(cfg, store, RunMode(), FakeHandle(SIM_INFO))
    manifest = export.export(store, str(tmp_path / "x"), "pretokenized")
    assert manifest["provenance"] == rec == store.read_json("provenance.json")
    on_disk = json.loads((tmp_path / "x" / "export.manifest").read_text())
    assert on_disk["provenance"]["fingerprint"] == rec["fingerprint"]
    final = finalize.finalize(store, allow_partial=True)
    assert final["provenance"] == rec
    assert store.read_json("final/manifest.json")["provenance"]["engine"]["version"] == "sim-0.1"
