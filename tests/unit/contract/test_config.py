"""contract/config.py: the engine config is a union on ``kind``, which every engine
section must name; each kind accepts only its own keys; a wrong config is one line
naming the dotted key; serve_apps loads the engine and serve sections of a run YAML
without the job's sections."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from contract.config import (ConfigError, EngineSections, SGLangEngineConfig,
                             SimulatorEngineConfig, load_engine_sections, parse_engine_config)
from jobs.config import load_config, parse_config

JOB = {"input": "p.jsonl", "output": "out", "run_name": "r"}


def _error(tree: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(tree)
    return str(info.value)


def test_kind_picks_the_variant_and_no_engine_section_is_the_simulator():
    assert isinstance(parse_config({"job": JOB}).engine, SimulatorEngineConfig)
    assert isinstance(parse_config({"engine": {"kind": "simulator", "model_path": "sim-x"},
                                    "job": JOB}).engine, SimulatorEngineConfig)
    engine = parse_config({"engine": {"kind": "sglang", "model_path": "Qwen/Qwen3-8B"},
                           "job": JOB}).engine
    assert isinstance(engine, SGLangEngineConfig) and engine.chat_template == "model"


def test_sglang_config_does_not_carry_the_simulator_knobs():
    assert "simulator" not in SGLangEngineConfig.model_fields
    message = _error({"engine": {"kind": "sglang", "model_path": "m",
                                 "simulator": {"time_scale": 0.1}}, "job": JOB})
    assert message.splitlines()[1:] == ["  engine.simulator: unknown key"]


def test_simulator_config_refuses_sglang_flags_naming_the_key():
    message = _error({"engine": {"kind": "simulator", "mem_fraction_static": 0.9}, "job": JOB})
    assert message.splitlines()[1:] == ["  engine.mem_fraction_static: unknown key"]


def test_errors_inside_a_variant_name_the_yaml_key_without_the_kind_tag():
    message = _error({"engine": {"kind": "simulator", "simulator": {"time_scale": -1}},
                      "job": JOB})
    assert message.splitlines()[1].startswith("  engine.simulator.time_scale: Input should be")
    message = _error({"engine": {"kind": "sglang"}, "job": JOB})
    assert message.splitlines()[1].startswith("  engine.model_path: Field required")


def test_unknown_kind_is_one_line_naming_engine_kind():
    message = _error({"engine": {"kind": "vllm", "model_path": "m"}, "job": JOB})
    assert message.splitlines()[1:] == [
        "  engine.kind: unknown kind 'vllm'; one of sglang, simulator"]


@pytest.mark.parametrize("engine", [
    {"model_path": "sim-x"},                      # would have passed as the simulator
    {"model_path": "Qwen/Qwen3-8B", "mem_fraction_static": 0.85, "reasoning_parser": "qwen3"},
    {"kind": None, "model_path": "sim-x"},        # `kind:` left empty in the YAML
])
def test_a_missing_kind_is_one_line_naming_engine_kind(engine):
    message = _error({"engine": engine, "job": JOB})
    assert message.splitlines()[1:] == ["  engine.kind is required: one of sglang, simulator"]


def test_the_b200_config_without_its_kind_line_says_the_kind_is_missing(tmp_path):
    # Its SGLang keys were five "unknown key" errors of the simulator, never the kind.
    shipped = Path(__file__).resolve().parents[3] / "jobs/configs/qwen36-27b-b200.yaml"
    lines = shipped.read_text().splitlines(keepends=True)
    kind = [line for line in lines if line.strip().startswith("kind:")]
    assert [line.split("#")[0].strip() for line in kind] == ["kind: sglang"]
    broken = tmp_path / "no-kind.yaml"
    broken.write_text("".join(line for line in lines if line not in kind))
    with pytest.raises(ConfigError) as info:
        load_config(str(broken))
    assert str(info.value).splitlines()[1:] == [
        "  engine.kind is required: one of sglang, simulator"]
    with pytest.raises(ConfigError, match=r"engine.kind is required: one of sglang, simulator"):
        load_engine_sections(str(broken))  # what a Serve app reads (serve_apps/app.py)


def test_an_engine_that_is_not_a_mapping_says_what_it_needs():
    message = _error({"engine": "sglang", "job": JOB})
    assert message.splitlines()[1:] == [
        "  engine: expected a mapping with a kind, one of sglang, simulator (got 'sglang')"]


def test_the_kind_is_required_in_code_too():
    with pytest.raises(ValidationError, match="engine.kind is missing or unknown"):
        parse_engine_config({"model_path": "sim-x"})
    with pytest.raises(ValidationError, match="kind"):
        SimulatorEngineConfig()  # as SGLangEngineConfig(): the class names its kind


def test_parse_engine_config_round_trips_both_kinds():
    for cfg in (SimulatorEngineConfig(kind="simulator", simulator={"time_scale": 0.01}),
                SGLangEngineConfig(kind="sglang", model_path="m", extra_args={"x": 1})):
        assert parse_engine_config(cfg.model_dump(mode="json")) == cfg


def test_simulator_reads_like_sglang_for_the_output_settings():
    # jobs/pipeline/rows.output_settings reads these on either kind.
    sim = SimulatorEngineConfig(kind="simulator")
    assert (sim.reasoning_parser, sim.extra_args) == ("qwen3", {})
    assert "reasoning_parser" not in sim.model_dump()


def test_load_engine_sections_reads_only_engine_and_serve(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("engine: {kind: sglang, model_path: m}\nserve: {app_name: a}\n"
                    "job: {anything: goes}\n")
    sections = load_engine_sections(str(path))
    assert isinstance(sections, EngineSections)
    assert sections.engine.model_path == "m" and sections.serve.app_name == "a"


def test_load_engine_sections_names_the_bad_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("serve: {max_ongoing_requests: 0}\n")
    with pytest.raises(ConfigError, match=r"serve.max_ongoing_requests: Input should be"):
        load_engine_sections(str(path))
    with pytest.raises(ConfigError, match="config file not found"):
        load_engine_sections(str(tmp_path / "missing.yaml"))
