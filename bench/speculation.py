"""Accept length side by side: raygen's rows against the engines' own figure.

raygen's row ``accept_length`` is SGLang's per-request ``spec_accept_length`` (completion
tokens / verify steps, the prefill's first token counted); a run's is the sum of tokens
over the sum of ``spec_verify_ct``. SGLang's scheduler counts the same steps its own
way: accepted tokens per verify step, logged as ``accept len: X`` at each decode log
interval and kept as a running average (``avg_spec_accept_length`` in /server_info's
internal_states, the intervals logged so far, the start-up warm-up included). Both are
printed, per engine, with the log lines' range: the figures must agree (to the log's two
decimals, over many rows).
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Optional

LOG_LINE = re.compile(r"accept len: ([0-9.]+)")


def engine_average(url: str) -> Optional[float]:
    """SGLang's running average accept length (/server_info internal_states)."""
    with urllib.request.urlopen(f"{url}/server_info", timeout=10) as resp:
        info = json.loads(resp.read())
    states = info.get("internal_states") or [{}]
    value = states[0].get("avg_spec_accept_length")
    return None if value is None else float(value)


def log_lines(app_name: str, session: Path) -> list[float]:
    """The ``accept len`` of every decode log line the app's engines wrote (the replicas'
    log files hold their engines' output: serve_apps/engine_process.py)."""
    values: list[float] = []
    for log in sorted((session / "logs" / "serve").glob(f"replica_{app_name}_*.log")):
        values += [float(m.group(1)) for m in LOG_LINE.finditer(log.read_text(errors="replace"))]
    return values


def summary_line(tokens: int, verify_steps: int, averages: list[Optional[float]],
                 lines: list[float]) -> str:
    raygen = f"{tokens / verify_steps:.4f}" if verify_steps else "none (no verify steps)"
    engines = ", ".join("none" if a is None else f"{a:.4f}" for a in averages)
    logged = (f"{len(lines)} log lines from {min(lines):.2f} to {max(lines):.2f}, the last "
              f"{lines[-1]:.2f}" if lines else "no log line")
    return (f"Accept length: raygen {raygen} ({tokens} tokens / {verify_steps} verify steps "
            f"of the raygen mode's rows); the engines' own avg_spec_accept_length {engines} "
            f"(SGLang's scheduler, since start-up); {logged}.")
