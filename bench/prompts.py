"""The benchmark's prompt file: jobs.demo_prompts.build (the demo's realistic mix of
coding / reasoning / multi-turn / tool-calling chats), written once per (rows, seed)
and reused by every mode of a run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable


def cached_jsonl(path: Path, rows: Iterable[dict]) -> Path:
    """Write ``rows`` to ``path`` as JSONL once: an existing file is the cache; a
    temporary name renamed into place means a killed writer never leaves half a file."""
    if path.exists():
        return path
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


def prompt_file(work_dir: Path, rows: int, seed: int = 0) -> Path:
    from jobs.demo_prompts import build
    return cached_jsonl(work_dir / f"prompts-{rows}-s{seed}.jsonl", build(rows, seed))
