"""Prompt keys do not depend on the process: two interpreters with different hash seeds
compute the same key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from jobs.pipeline.validate import parse_row, prompt_key

REPO = Path(__file__).resolve().parents[4]
USER = {"role": "user", "content": "hi"}


def row(**fields) -> str:
    fields.setdefault("messages", [USER])
    return json.dumps(fields)


def test_hash_key_stable_across_processes():
    # Python's str hash is salted per process; the key must not be.
    code = ("import json; from jobs.pipeline.validate import parse_row; "
            "print(parse_row(json.dumps({'messages': [{'role': 'user', 'content': 'hi'}]}))['key'])")
    keys = {subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                           text=True, check=True, env={**os.environ, "PYTHONHASHSEED": seed}
                           ).stdout.strip() for seed in ("1", "2")}
    assert keys == {parse_row(row())["key"]}
    assert prompt_key([USER], None) == parse_row(row())["key"]
