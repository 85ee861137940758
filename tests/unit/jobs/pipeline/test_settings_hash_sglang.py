"""The settings hash of a real-engine run covers the SGLang-only output settings (the
simulator kind has no reasoning_parser or extra_args keys to change)."""

from __future__ import annotations

import pytest

from jobs.config import parse_config
from jobs.pipeline.settings import StageSettings

JOB = {"input": "p.jsonl", "output": "/tmp/o", "run_name": "r", "max_new_tokens": 4096}
SGLANG = {"kind": "sglang", "model_path": "Qwen/Qwen3-8B", "context_length": 16384}


def _hash(**engine) -> str:
    cfg = parse_config({"engine": {**SGLANG, **engine}, "job": JOB})
    return StageSettings.of(cfg).settings_hash


@pytest.mark.parametrize("change", [
    {"reasoning_parser": "deepseek-r1"},
    {"extra_args": {"dtype": "bfloat16"}},
    {"chat_template": "builtin"},
])
def test_sglang_output_settings_change_the_hash(change):
    assert _hash(**change) != _hash()


def test_sglang_throughput_settings_do_not():
    assert _hash(mem_fraction_static=0.9, enable_metrics=False) == _hash()
