"""The engine's argv, environment and output lines reach the replica log (the Ray
dashboard) with secret-looking values masked: contract/redact.py, used by EngineProcess."""

from __future__ import annotations

import io
import logging

import pytest

from contract.redact import is_secret_name, mask_argv, mask_env, mask_text
from serve_apps import engine_process
from serve_apps.engine_process import EngineProcess

SECRET = "sk-live-4f2a9c"


@pytest.mark.parametrize("name", ["--api-key", "--admin-api-key", "--ssl-keyfile-password",
                                  "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "watermark_key",
                                  "--hf-token", "db.password"])
def test_secret_looking_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["--max-total-tokens", "--num-reserved-decode-tokens",
                                  "--tokenizer-path", "--ssl-keyfile", "--keyfile-dir",
                                  "SGLANG_USE_CPU_ENGINE", "--model-path"])
def test_other_names_keep_their_values(name):
    assert not is_secret_name(name)


def test_mask_argv_masks_the_value_after_or_inside_a_secret_flag():
    argv = ["python", "-m", "sglang.launch_server", "--api-key", SECRET,
            f"--admin-api-key={SECRET}", "--max-total-tokens", "4096", "--hf-token",
            "--enable-metrics"]
    assert mask_argv(argv) == ["python", "-m", "sglang.launch_server", "--api-key", "***",
                               "--admin-api-key=***", "--max-total-tokens", "4096",
                               "--hf-token", "--enable-metrics"]


def test_mask_text_masks_sglangs_server_args_line_and_echoed_flags():
    line = (f"server_args=ServerArgs(model_path='m', api_key='{SECRET}', admin_api_key=None, "
            f"max_total_tokens=4096, ssl_keyfile_password=\"{SECRET}\") "
            f"{{'api_key': '{SECRET}'}} launch: --api-key {SECRET} --port 3 "
            f"--admin-api-key={SECRET} --max-total-tokens=4096")
    masked = mask_text(line)
    assert SECRET not in masked
    assert "max_total_tokens=4096" in masked and "admin_api_key=None" in masked
    assert "--port 3" in masked and "api_key='***'" in masked
    assert "--admin-api-key=*** --max-total-tokens=4096" in masked


def test_mask_env():
    assert mask_env({"HF_TOKEN": SECRET, "SGLANG_USE_CPU_ENGINE": "1", "X_TOKEN": ""}) == {
        "HF_TOKEN": "***", "SGLANG_USE_CPU_ENGINE": "1", "X_TOKEN": ""}


class _FakeProc:
    """What Popen returns for the guard: it prints SGLang's start-up line and exits."""

    def __init__(self, argv, **kwargs):
        self.argv, self.pid = argv, 4242
        self.stdout = io.StringIO(f"server_args=ServerArgs(api_key='{SECRET}', port=3)\n"
                                  "engine ready\n")

    def poll(self):
        return 0


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_an_engine_start_logs_and_keeps_no_secret(monkeypatch):
    started = []
    monkeypatch.setattr(engine_process.subprocess, "Popen",
                        lambda argv, **kw: started.append(argv) or _FakeProc(argv, **kw))
    # On the logger itself: Ray's "ray" logger does not propagate to pytest's root handler.
    records = _Records()
    monkeypatch.setattr(engine_process.logger, "level", logging.INFO)
    engine_process.logger.addHandler(records)
    try:
        engine = EngineProcess(["python", "-m", "sglang.launch_server", "--api-key", SECRET],
                               "127.0.0.1", 31000, env={"HF_TOKEN": SECRET})
        engine.start()
        engine._relay.join(timeout=10)
    finally:
        engine_process.logger.removeHandler(records)
    assert started[0][-1] == SECRET  # the engine itself gets the real value
    logged = "\n".join(records.lines)
    assert "starting engine: HF_TOKEN=*** " in logged and "--api-key ***" in logged
    assert "engine ready" in logged  # its output is relayed ...
    assert SECRET not in logged      # ... masked, like the argv
    assert SECRET not in engine.last_lines() and "api_key='***'" in engine.last_lines()
