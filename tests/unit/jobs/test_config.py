"""jobs.config: load_config / parse_config / apply_overrides, every error names its key."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from jobs.config import ConfigError, RunConfig, apply_overrides, load_config, parse_config

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "jobs" / "configs" / "demo.yaml"          # real SGLang on CPU
DEMO_SIM = REPO / "jobs" / "configs" / "demo-sim.yaml"  # the story-scale simulator demo

BASE = {"job": {"input": "prompts.jsonl", "output": "out", "run_name": "r1"}}


def tree(**sections) -> dict:
    t = copy.deepcopy(BASE)
    for name, values in sections.items():
        t.setdefault(name, {}).update(values)
    return t


def error_of(t: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(t, source="test.yaml")
    return str(info.value)


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# --- the shipped demo -------------------------------------------------------------------

def test_demo_yaml_loads_with_its_values():
    cfg = load_config(str(DEMO))
    assert isinstance(cfg, RunConfig)
    assert (cfg.engine.kind, cfg.engine.device) == ("sglang", "cpu")
    assert cfg.engine.model_path == ".local/models/sampled"  # what `make run` builds
    assert cfg.engine.max_total_tokens == 65536
    assert cfg.serve.autoscaling.min_replicas == 2
    assert cfg.job.input == ["s3://raygen-demo/prompts/demo.jsonl"]  # str -> list
    assert cfg.job.max_new_tokens == 256
    # the sampled model's length distribution is made for plain sampling
    assert (cfg.job.sampling.temperature, cfg.job.sampling.top_p,
            cfg.job.sampling.top_k) == (1.0, 1.0, -1)
    assert cfg.job.run_name == "demo"
    assert cfg.storage.endpoint_url == "http://127.0.0.1:9330"


def test_demo_sim_yaml_loads_with_its_values():
    cfg = load_config(str(DEMO_SIM))
    assert cfg.engine.kind == "simulator"
    assert cfg.engine.context_length == 16384
    assert cfg.engine.speculative is not None and cfg.engine.speculative.num_steps == 3
    assert cfg.engine.simulator.time_scale == 0.05
    assert cfg.serve.max_ongoing_requests == 256
    assert cfg.job.input == ["s3://raygen-demo/prompts/demo-sim.jsonl"]
    assert cfg.job.max_new_tokens == 4096
    assert (cfg.job.run_name, cfg.serve.app_name) == ("demo-sim", "raygen-demo-sim")


def test_demo_yaml_with_overrides():
    cfg = load_config(str(DEMO), ["job.max_new_tokens=512", "job.run_name=demo-2"])
    assert cfg.job.max_new_tokens == 512
    assert cfg.job.run_name == "demo-2"


def test_minimal_config_gets_defaults():
    cfg = parse_config(copy.deepcopy(BASE))
    assert cfg.job.input == ["prompts.jsonl"]
    assert cfg.job.sampling.temperature == 0.6
    assert cfg.engine.kind == "simulator"
    assert cfg.serve.max_ongoing_requests >= cfg.engine.max_running_requests


def test_input_list_is_kept():
    cfg = parse_config(tree(job={"input": ["a.jsonl", "s3://b/c.parquet"]}))
    assert cfg.job.input == ["a.jsonl", "s3://b/c.parquet"]


# --- unknown keys -----------------------------------------------------------------------

@pytest.mark.parametrize("t, dotted", [
    (dict(BASE, jbo={"x": 1}), "jbo"),
    (tree(job={"max_new_tokns": 5}), "job.max_new_tokns"),
    (tree(engine={"kind": "simulator", "simulator": {"time_scael": 0.1}}), "engine.simulator.time_scael"),
    (tree(job={"sampling": {"temprature": 0.7}}), "job.sampling.temprature"),
    (tree(serve={"autoscaling": {"max_replica": 3}}), "serve.autoscaling.max_replica"),
    (tree(storage={"bucket": "x"}), "storage.bucket"),
])
def test_unknown_key_names_dotted_key(t, dotted):
    msg = error_of(t)
    assert f"{dotted}: unknown key" in msg
    assert "test.yaml" in msg


def test_unknown_key_in_file_names_key_and_file(tmp_path):
    path = write(tmp_path, "job:\n  input: a.jsonl\n  output: o\n  run_name: r\n"
                           "  sampling:\n    temprature: 0.7\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "job.sampling.temprature" in str(info.value)
    assert "unknown key" in str(info.value)
    assert path in str(info.value)


def test_missing_job_section_is_named():
    msg = error_of({})
    assert "job:" in msg and "Field required" in msg


def test_missing_required_job_field_is_named():
    t = copy.deepcopy(BASE)
    del t["job"]["run_name"]
    assert "job.run_name" in error_of(t)


# --- bad values -------------------------------------------------------------------------

def test_bad_value_type_names_key_and_value(tmp_path):
    path = write(tmp_path, "job:\n  input: a.jsonl\n  output: o\n  run_name: r\n"
                           "  max_new_tokens: abc\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert "job.max_new_tokens" in msg
    assert "'abc'" in msg


def test_bad_literal_names_key():
    msg = error_of(tree(job={"context_policy": "truncate"}))
    assert "job.context_policy" in msg


def test_out_of_range_names_key():
    msg = error_of(tree(job={"sampling": {"top_p": 1.5}}))
    assert "job.sampling.top_p" in msg


@pytest.mark.parametrize("name", ["a/b", "../x", "runs/2024", ".hidden", "", "a b"])
def test_run_name_rejected(name):
    msg = error_of(tree(job={"run_name": name}))
    assert "job.run_name" in msg
    assert "folder name" in msg


def test_run_name_with_trailing_newline_rejected():
    # `$` in RUN_NAME matches before a trailing "\n": "demo\n" must not become a folder.
    msg = error_of(tree(job={"run_name": "demo\n"}))
    assert "job.run_name" in msg


@pytest.mark.parametrize("name", ["demo", "run-2024.01_a", "A" * 128])
def test_run_name_accepted(name):
    assert parse_config(tree(job={"run_name": name})).job.run_name == name


def test_run_name_too_long():
    assert "job.run_name" in error_of(tree(job={"run_name": "A" * 129}))


# --- cross-field checks -----------------------------------------------------------------

def test_context_length_equal_to_budget_names_both_keys():
    # The story's mistake: 8192 context with an 8192 budget leaves no room for a prompt.
    msg = error_of(tree(engine={"kind": "simulator", "context_length": 8192},
                        job={"max_new_tokens": 8192}))
    assert "engine.context_length (8192)" in msg
    assert "job.max_new_tokens (8192)" in msg


def test_context_length_below_budget_rejected():
    msg = error_of(tree(engine={"kind": "simulator", "context_length": 4096},
                        job={"max_new_tokens": 8192}))
    assert "engine.context_length" in msg and "job.max_new_tokens" in msg


def test_context_length_just_above_budget_ok():
    cfg = parse_config(tree(engine={"kind": "simulator", "context_length": 8193},
                            job={"max_new_tokens": 8192}))
    assert cfg.engine.context_length == 8193


def test_serve_queue_shorter_than_engine_batch():
    msg = error_of(tree(serve={"max_ongoing_requests": 32},
                        engine={"kind": "simulator", "max_running_requests": 48},
                        job={"max_actors": 1, "inflight_rows_per_actor": 16}))
    assert "serve.max_ongoing_requests (32)" in msg
    assert "engine.max_running_requests (48)" in msg


def test_serve_queue_equal_to_engine_batch_ok():
    cfg = parse_config(tree(serve={"max_ongoing_requests": 48},
                            engine={"kind": "simulator", "max_running_requests": 48},
                            job={"max_actors": 1, "inflight_rows_per_actor": 48}))
    assert cfg.serve.max_ongoing_requests == 48


def test_serve_limit_below_rows_in_flight_per_replica():
    # 2 actors x 256 rows over 4 replicas = 128 per replica; Serve admits only 100
    msg = error_of(tree(serve={"max_ongoing_requests": 100,
                               "autoscaling": {"min_replicas": 4, "max_replicas": 4}},
                        job={"max_actors": 2, "inflight_rows_per_actor": 256}))
    assert "serve.max_ongoing_requests (100)" in msg
    assert "(128 = job.max_actors 2 x job.inflight_rows_per_actor 256" in msg
    assert "about twice that (256)" in msg


def test_serve_limit_share_uses_min_replicas_and_zero_means_one():
    ok = parse_config(tree(serve={"max_ongoing_requests": 128,
                                  "autoscaling": {"min_replicas": 4, "max_replicas": 8}},
                           job={"max_actors": 2, "inflight_rows_per_actor": 256}))
    assert ok.serve.max_ongoing_requests == 128
    msg = error_of(tree(serve={"max_ongoing_requests": 128,
                               "autoscaling": {"min_replicas": 0, "max_replicas": 8}},
                        job={"max_actors": 2, "inflight_rows_per_actor": 256}))
    assert "(512 = " in msg


def test_min_actors_above_max_actors():
    msg = error_of(tree(job={"min_actors": 3, "max_actors": 2}))
    assert "job.min_actors (3)" in msg and "job.max_actors (2)" in msg


def test_autoscaling_min_above_max_names_section():
    msg = error_of(tree(serve={"autoscaling": {"min_replicas": 3, "max_replicas": 2}}))
    assert "serve.autoscaling" in msg
    assert "min_replicas (3) > max_replicas (2)" in msg


def test_breaker_min_rows_above_window_rejected():
    # With window_rows < min_rows the window can never hold min_rows rows, so the
    # breaker is silently disabled; a config like this must fail at submit time.
    msg = error_of(tree(job={"breaker": {"window_rows": 20, "min_rows": 50}}))
    assert "job.breaker" in msg


# --- --set overrides --------------------------------------------------------------------

def test_override_nested_existing_key():
    t = apply_overrides(copy.deepcopy(BASE), ["job.max_new_tokens=2048"])
    assert t["job"]["max_new_tokens"] == 2048


def test_override_creates_new_nested_sections():
    t = apply_overrides(copy.deepcopy(BASE), ["engine.kind=simulator",
                                              "engine.speculative.num_steps=5"])
    assert t["engine"] == {"kind": "simulator", "speculative": {"num_steps": 5}}
    cfg = parse_config(t)
    assert cfg.engine.speculative.num_steps == 5
    assert cfg.engine.speculative.algorithm == "NEXTN"


@pytest.mark.parametrize("raw, value", [
    ("8192", 8192), ("0.7", 0.7), ("[a, b]", ["a", "b"]), ("[1, 2]", [1, 2]),
    ("null", None), ("~", None), ("true", True), ("hello", "hello"), ("'007'", "007"),
    ("{x: 1}", {"x": 1}), ("", ""), ("a=b", "a=b"),
])
def test_override_values_parsed_as_yaml(raw, value):
    t = apply_overrides({}, [f"a.b={raw}"])
    assert t["a"]["b"] == value
    assert type(t["a"]["b"]) is type(value)


def test_override_strips_key_whitespace():
    assert apply_overrides({}, [" job.limit =5"]) == {"job": {"limit": 5}}


def test_overrides_apply_in_order():
    t = apply_overrides({}, ["job.limit=1", "job.limit=2"])
    assert t["job"]["limit"] == 2


def test_override_null_resets_optional_section(tmp_path):
    cfg = load_config(str(DEMO_SIM), ["engine.speculative=null", "job.input=[a.jsonl, b.jsonl]"])
    assert cfg.engine.speculative is None
    assert cfg.job.input == ["a.jsonl", "b.jsonl"]


@pytest.mark.parametrize("item", ["foo", "=5", "  =5"])
def test_malformed_override(item):
    with pytest.raises(ConfigError) as info:
        apply_overrides({}, [item])
    assert "expected key=value" in str(info.value)
    assert repr(item) in str(info.value)


def test_override_into_scalar_is_an_error():
    with pytest.raises(ConfigError) as info:
        apply_overrides(copy.deepcopy(BASE), ["job.run_name.x=1"])
    assert "job.run_name.x" in str(info.value)
    assert "'run_name' is not a section" in str(info.value)


def test_override_of_unknown_key_fails_validation_naming_it():
    with pytest.raises(ConfigError) as info:
        load_config(str(DEMO), ["job.sampling.temprature=0.7"])
    assert "job.sampling.temprature: unknown key" in str(info.value)


def test_override_bad_value_type_names_key():
    with pytest.raises(ConfigError) as info:
        load_config(str(DEMO), ["job.max_new_tokens=lots"])
    assert "job.max_new_tokens" in str(info.value)


def test_override_triggers_cross_field_check():
    with pytest.raises(ConfigError) as info:
        load_config(str(DEMO), ["engine.context_length=256"])
    assert "engine.context_length (256)" in str(info.value)


# --- file-level errors ------------------------------------------------------------------

def test_yaml_syntax_error(tmp_path):
    path = write(tmp_path, "job:\n  input: [a.jsonl\n  run_name: r\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "is not valid YAML" in str(info.value)
    assert path in str(info.value)


def test_missing_file(tmp_path):
    path = str(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "config file not found" in str(info.value)
    assert path in str(info.value)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_top_level_not_a_mapping(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "top level must be a mapping" in str(info.value)


def test_empty_file_reports_missing_job(tmp_path):
    path = write(tmp_path, "")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "job" in str(info.value) and "Field required" in str(info.value)


def test_config_is_frozen():
    cfg = parse_config(copy.deepcopy(BASE))
    with pytest.raises(Exception):
        cfg.job.max_new_tokens = 5  # type: ignore[misc]


def test_sampling_to_sglang_drops_unset():
    cfg = parse_config(tree(job={"sampling": {"stop": ["</answer>"], "top_k": -1}}))
    params = cfg.job.sampling.to_sglang()
    assert params["stop"] == ["</answer>"]
    assert params["top_k"] == -1
    assert "presence_penalty" not in params and "stop_token_ids" not in params
    assert params["min_p"] == 0.0 and params["ignore_eos"] is False


def test_yaml_safe_load_refuses_python_tags(tmp_path):
    path = write(tmp_path, "job: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "not valid YAML" in str(info.value)
