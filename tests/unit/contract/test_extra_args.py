"""engine.extra_args cannot take over a flag raygen sets, passes only plain scalar values,
refuses YAML 1.1's word booleans and nulls with the fix, and never shows a credential.

Each refusal is a ConfigError line naming engine.extra_args.<key> and what to set instead;
the argv a valid config builds is checked against SGLang's own parser in
tests/contract/sglang/test_sglang_contract.py.
"""

from __future__ import annotations

import pytest

from contract.config import ConfigError, RESERVED_FLAGS, load_engine_sections
from jobs.config import apply_overrides, load_config, parse_config
from serve_apps.engines.sglang import build_command

JOB = {"input": "p.jsonl", "output": "out", "run_name": "r"}


def _tree(extra: dict, **engine) -> dict:
    return {"engine": {"kind": "sglang", "model_path": "Qwen/Qwen3.6-27B",
                       "extra_args": extra, **engine}, "job": JOB}


def _error(tree: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(tree)
    return str(info.value)


def _argv(tree: dict) -> list[str]:
    return build_command(parse_config(tree).engine, "127.0.0.1", 31000, python="python")


@pytest.mark.parametrize("key, instead", [
    ("host", "binds its engine to 127.0.0.1"),
    ("--port", "free port"),
    ("model-path", "engine.model_path"),
    ("--model", "engine.model_path"),               # SGLang's alias of --model-path
    ("model_path", "engine.model_path"),            # underscores become dashes
    ("served-model-name", "engine.served_model_name"),
    ("context-length", "engine.context_length"),
    ("max_running_requests", "engine.max_running_requests"),
    ("base-gpu-id", "one GPU Ray gave it"),
    ("tp-size", "one engine per GPU"),
    ("tensor-parallel-size", "one engine per GPU"),
    ("speculative-algorithm", "engine.speculative.algorithm"),
    ("speculative-num-draft-tokens", "engine.speculative.num_draft_tokens"),
    ("speculative-draft-model", "engine.speculative.draft_model_path"),
    ("enable-metrics", "engine.enable_metrics"),
    ("max-total-tokens", "engine.max_total_tokens"),
    ("mem-fraction-static", "engine.mem_fraction_static"),
    ("reasoning-parser", "engine.reasoning_parser"),
    ("device", "engine.device"),
])
def test_a_flag_raygen_sets_is_refused_naming_the_key_and_what_to_set(key, instead):
    message = _error(_tree({key: "0.0.0.0" if key == "host" else 1},
                           speculative={"algorithm": "NEXTN"}))
    (line,) = message.splitlines()[1:]
    assert line.startswith(f"  engine.extra_args.{key}: ")
    assert "is set by raygen" in line and instead in line, line


def test_the_issues_override_of_host_is_refused_before_anything_starts():
    tree = apply_overrides(_tree({}), ["engine.extra_args.host=0.0.0.0"])
    assert "engine.extra_args.host: " in _error(tree)


@pytest.mark.parametrize("key, reserved", [("tp", "tp-size"), ("served-model", "served-model-name"),
                                           ("context-len", "context-length"),
                                           ("--max-running", "max-running-requests")])
def test_an_abbreviation_sglang_would_expand_to_a_reserved_flag_is_refused(key, reserved):
    message = _error(_tree({key: 2}))
    assert f"engine.extra_args.{key}: " in message
    assert f"abbreviates --{reserved}" in message


def test_speculative_tuning_flags_pass_only_with_speculative_decoding_on():
    message = _error(_tree({"speculative-attention-mode": "decode"}))
    assert "extra_args.speculative-attention-mode: speculative decoding is off" in message
    argv = _argv(_tree({"speculative-attention-mode": "decode"},
                       speculative={"algorithm": "NEXTN"}))
    assert argv[-2:] == ["--speculative-attention-mode", "decode"]


@pytest.mark.parametrize("key", ["host=0.0.0.0", "--model-path=x", "-m", "watchdog timeout", ""])
def test_a_key_that_is_not_a_bare_flag_name_is_refused(key):
    assert "is not a flag name" in _error(_tree({key: 1}))


def test_other_flags_pass_through_as_before():
    argv = _argv(_tree({"watchdog-timeout": 600, "--decode-log-interval": 40,
                        "enable_cache_report": True, "disable-radix-cache": False,
                        "chunked-prefill-size": "-1", "attention-backend": "trtllm_mha"}))
    assert argv[-8:] == ["--watchdog-timeout", "600", "--decode-log-interval", "40",
                         "--enable-cache-report", "--chunked-prefill-size", "-1",
                         "--attention-backend", "trtllm_mha"][-8:]
    assert "--disable-radix-cache" not in argv
    assert argv.count("--host") == 1 and argv[argv.index("--host") + 1] == "127.0.0.1"


# --- values -------------------------------------------------------------------------------

def _config_file(tmp_path, extra_yaml: str, engine_yaml: str = "") -> str:
    path = tmp_path / "run.yaml"
    path.write_text("engine:\n  kind: sglang\n  model_path: Qwen/Qwen3.6-27B\n" + engine_yaml
                    + "  extra_args:\n" + extra_yaml
                    + "job:\n  input: p.jsonl\n  output: out\n  run_name: r\n")
    return str(path)


@pytest.mark.parametrize("word", ["off", "no", "Yes", "ON"])
def test_a_yaml_1_1_boolean_word_is_refused_with_how_to_pass_it(tmp_path, word):
    # PyYAML reads these as booleans: `off` would have dropped the flag without a word.
    with pytest.raises(ConfigError) as info:
        load_config(_config_file(tmp_path, f"    mamba-radix-cache-strategy: {word}\n"))
    line = str(info.value).splitlines()[1]
    assert line.startswith("  engine.extra_args.mamba-radix-cache-strategy: ")
    assert "is a YAML 1.1 boolean" in line and f"quote it ('{word}')" in line


def test_the_same_word_quoted_is_passed_as_text_and_true_false_keep_their_meaning(tmp_path):
    cfg = load_config(_config_file(tmp_path, "    mamba-radix-cache-strategy: 'off'\n"
                                             "    enable-cache-report: true\n"
                                             "    disable-radix-cache: false\n"))
    argv = build_command(cfg.engine, "127.0.0.1", 1)
    assert argv[-3:] == ["--mamba-radix-cache-strategy", "off", "--enable-cache-report"]
    assert "--disable-radix-cache" not in argv


def test_word_booleans_still_set_typed_bool_fields(tmp_path):
    cfg = load_config(_config_file(tmp_path, "    watchdog-timeout: 600\n",
                                   engine_yaml="  enable_metrics: off\n"))
    assert cfg.engine.enable_metrics is False
    assert cfg.engine.extra_args == {"watchdog-timeout": 600}
    tree = apply_overrides(_tree({}), ["engine.enable_metrics=no"])
    assert parse_config(tree).engine.enable_metrics is False


def test_an_override_with_a_word_boolean_is_refused_too():
    tree = apply_overrides(_tree({}), ["engine.extra_args.mamba-radix-cache-strategy=off"])
    assert "is a YAML 1.1 boolean" in _error(tree)
    tree = apply_overrides(_tree({}), ["engine.extra_args.mamba-radix-cache-strategy='off'"])
    assert parse_config(tree).engine.extra_args == {"mamba-radix-cache-strategy": "off"}


def test_the_serve_app_reads_the_config_file_the_same_way(tmp_path):
    with pytest.raises(ConfigError, match="engine.extra_args.x-flag: .*YAML 1.1 boolean"):
        load_engine_sections(_config_file(tmp_path, "    x-flag: no\n"))


@pytest.mark.parametrize("value, says", [
    (None, "null is not a flag value"),
    ([1, 2], "a list is not a flag value"),
    ({"a": 1}, "a dict is not a flag value"),
    ("--host", "starting with '-' would be read by SGLang's parser as another flag"),
    ("-h", "starting with '-'"),
])
def test_a_value_that_is_not_a_plain_scalar_is_refused(value, says):
    message = _error(_tree({"watchdog-timeout": value}))
    assert message.splitlines()[1].startswith("  engine.extra_args.watchdog-timeout: ")
    assert says in message


def test_a_negative_number_is_a_value():
    assert _argv(_tree({"chunked-prefill-size": -1, "x-offset": "-0.5"}))[-4:] == [
        "--chunked-prefill-size", "-1", "--x-offset", "-0.5"]


def test_an_error_never_echoes_a_secret_looking_value():
    message = _error(_tree({"api-key": "-sk-live-123"}))
    assert "engine.extra_args.api-key: " in message
    assert "sk-live-123" not in message


def test_reserved_flags_are_spelled_as_sglang_spells_them():
    assert all(flag == flag.lower() and not flag.startswith("-") and "_" not in flag
               for flag in RESERVED_FLAGS)
