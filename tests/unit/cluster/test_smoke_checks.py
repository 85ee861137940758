"""cluster/smoke_checks.py: each check of a smoke phase passes on a sound phase and names
itself and its figure on the phase it exists for."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from cluster.smoke_checks import (CHECKS, Phase, accept_length, counter_increase, counter_total,
                                  failed)
from jobs.config import load_config

REPO = Path(__file__).resolve().parents[3]
B200 = REPO / "jobs" / "configs" / "qwen36-27b-b200.yaml"
METRICS = """# HELP sglang:num_retracted_requests_total Total retracted requests.
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{model_name="m",engine_type="unified"} %s
sglang:num_retracted_reqs{model_name="m"} 0.0
"""


def _data(n: int = 4, **columns) -> pd.DataFrame:
    rows = {"key": [f"k{i}" for i in range(n)], "finish_reason": ["stop"] * n,
            "completion_tokens": [300] * n, "spec_verify_ct": [100] * n,
            "prompt_tokens": [500] * n, "integrity_flags": [[] for _ in range(n)]}
    rows.update(columns)
    return pd.DataFrame(rows)


def _phase(**changes) -> Phase:
    cfg = load_config(str(B200))
    rows = cfg.job.max_actors * cfg.job.inflight_rows_per_actor
    per_engine = -(-rows // cfg.serve.autoscaling.min_replicas)
    info = {"max_running_requests": cfg.engine.max_running_requests,
            "max_total_num_tokens": 10**7,
            "internal_states": [{"effective_max_running_requests_per_dp":
                                 max(per_engine, cfg.engine.max_running_requests)}]}
    values = dict(cfg=cfg, prompts=4, data=_data(), failures=0, server_info=info,
                  metrics_text=METRICS % "0.0")
    values.update(changes)
    return Phase(**values)


def _names(lines: list[str]) -> list[str]:
    return [line.split(":")[0] for line in lines]


def test_a_sound_phase_of_the_b200_config_passes():
    assert failed(_phase()) == []


def test_rows_missing_failed_or_without_a_finish_reason_fail_the_rows_check():
    assert _names(failed(_phase(prompts=5))) == ["rows"]
    assert _names(failed(_phase(failures=1))) == ["rows"]
    (line,) = failed(_phase(data=_data(finish_reason=["stop", None, "length", "stop"])))
    assert line == "rows: 4 of 4 prompts came back as rows (0 failure rows, 1 without a finish reason)"


def test_speculation_that_accepts_nothing_or_reports_nothing_fails():
    # 300 tokens: the prefill's first, then one a step for 299 steps (no draft agreed)
    (line,) = failed(_phase(data=_data(spec_verify_ct=[299] * 4)))
    assert line.startswith("accept_length: speculative decoding (NEXTN) is on and the rows' "
                           "accept length is 1.0")
    assert _names(failed(_phase(data=_data(spec_verify_ct=[None] * 4)))) == ["accept_length"]
    assert accept_length(_data()) == 2.99
    # a continued row prefilled twice: 300 tokens, two of them from prefills
    assert accept_length(_data(continuations=[1] * 4, spec_verify_ct=[298] * 4)) == 1.0


def test_flagged_rows_fail_and_name_their_flags():
    flags = [["token_run"], [], ["missing_think_end", "token_run"], []]
    (line,) = failed(_phase(data=_data(integrity_flags=flags)))
    assert line == "flagged: 2 of 4 rows carry integrity flags (missing_think_end, token_run)"


def test_an_engine_that_runs_fewer_requests_than_planned_or_a_small_pool_fails_capacity():
    phase = _phase()
    phase.server_info["internal_states"] = [{"effective_max_running_requests_per_dp": 8}]
    (line,) = failed(phase)
    assert line.startswith("capacity: the engine runs at most 8 requests, the config plans 40")
    small = _phase()
    small.server_info["max_total_num_tokens"] = 20000
    (line,) = failed(small)
    assert line.startswith("capacity: ") and "do not fit the engine's KV pool of 20000" in line


def test_retractions_fail_and_the_counter_is_summed_over_its_labels():
    (line,) = failed(_phase(metrics_text=METRICS % "3.0"))
    assert line.startswith("retractions: the engine retracted 3 requests")
    assert counter_total(METRICS % "2.0", "sglang:num_retracted_requests_total") == 2.0
    assert counter_total("", "sglang:num_retracted_requests_total") is None


def test_only_the_retractions_during_the_phase_count_on_an_attached_engine():
    """A smoke attached to a running engine reads its counter before and after: the
    engine's earlier retractions are not the phase's; one that restarted counts anew."""
    assert failed(_phase(metrics_before=METRICS % "5.0", metrics_text=METRICS % "5.0")) == []
    (line,) = failed(_phase(metrics_before=METRICS % "5.0", metrics_text=METRICS % "7.0"))
    assert line.startswith("retractions: the engine retracted 2 requests")
    (line,) = failed(_phase(metrics_before=METRICS % "5.0", metrics_text=METRICS % "1.0"))
    assert line.startswith("retractions: the engine retracted 1 requests")
    assert counter_increase("", METRICS % "4.0", "sglang:num_retracted_requests_total") == 4.0


@pytest.mark.parametrize("check", CHECKS)
def test_every_check_is_documented(check):
    import cluster.smoke_checks as module
    assert f"``{check}``" in module.__doc__
