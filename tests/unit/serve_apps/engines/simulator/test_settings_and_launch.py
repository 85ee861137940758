import sys

import pytest
from pydantic import ValidationError

from serve_apps.engines.simulator.__main__ import parse_args
from serve_apps.engines.simulator.launch import build_command
from contract.simulator_settings import FAULT_FIELDS, SimulatorSettings


def test_defaults_match_the_brief():
    s = SimulatorSettings()
    assert (s.model_name, s.context_length, s.max_running_requests) == ("sim-qwen", 32768, 48)
    assert (s.per_request_decode_tok_s, s.max_decode_tok_s, s.prefill_tok_s) == (100.0, 3500.0, 20000.0)
    assert (s.time_scale, s.startup_s, s.accept_length) == (1.0, 0.0, 3.0)
    assert (s.error_rate, s.error_status, s.slow_rate, s.slow_factor, s.crash_after_requests, s.seed) == (0.0, 500, 0.0, 5.0, None, 0)
    assert s.speculative


def test_every_field_is_documented():
    for name, field in SimulatorSettings.model_fields.items():
        assert field.description, name


def test_extra_fields_and_bad_values_are_rejected():
    with pytest.raises(ValidationError):
        SimulatorSettings(time_scal=0.1)
    with pytest.raises(ValidationError):
        SimulatorSettings(error_rate=1.5)
    with pytest.raises(ValidationError):
        SimulatorSettings(time_scale=float("inf"))


def test_cli_round_trip_is_exact():
    s = SimulatorSettings(model_name="m x", time_scale=0.013, crash_after_requests=7, accept_length=0, seed=-3, length_sigma=0.1 + 0.2)
    assert SimulatorSettings.from_cli_args(s.to_cli_args()) == s
    assert SimulatorSettings.from_cli_args(SimulatorSettings().to_cli_args()) == SimulatorSettings()
    assert SimulatorSettings.from_cli_args([]) == SimulatorSettings()
    assert SimulatorSettings.from_cli_args(["--crash-after-requests", "none"]).crash_after_requests is None


def test_build_command_shape_and_main_parser():
    s = SimulatorSettings(time_scale=0.01, max_running_requests=2)
    cmd = build_command(s, "127.0.0.1", 31000)
    assert cmd[:7] == [sys.executable, "-m", "serve_apps.engines.simulator", "--host", "127.0.0.1", "--port", "31000"]
    assert cmd[7:] == s.to_cli_args()
    assert build_command(s, "h", 1, python="/x/python")[0] == "/x/python"
    parsed, host, port = parse_args(cmd[3:])
    assert (parsed, host, port) == (s, "127.0.0.1", 31000)


def test_main_parser_rejects_invalid_values():
    with pytest.raises(SystemExit) as e:
        parse_args(["--error-rate", "2"])
    assert e.value.code == 2


def test_fault_fields_exist():
    s = SimulatorSettings()
    assert set(s.fault_settings()) == set(FAULT_FIELDS)
