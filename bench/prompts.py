"""The benchmark's prompt file: jobs.demo_prompts.build (the demo's realistic mix of
coding / reasoning / multi-turn / tool-calling chats), written once per (rows, seed)
and reused by every mode of a run."""

from __future__ import annotations

import json
import os
from pathlib import Path


def prompt_file(work_dir: Path, rows: int, seed: int = 0) -> Path:
    path = work_dir / f"prompts-{rows}-s{seed}.jsonl"
    if path.exists():
        return path
    from jobs.demo_prompts import build
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        for row in build(rows, seed):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path
