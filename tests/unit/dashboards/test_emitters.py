"""The emitters' own logic: category cap, dashboard link, SGLang relay, config keys."""

from __future__ import annotations

import pytest

from dashboards import metrics_catalog as mc
from jobs.pipeline.category_cap import OTHER_CATEGORY, CategoryCap
from jobs.runs.job_metrics import dashboard_url
from tests.support.fake_gauges import record_gauges


def test_category_cap_keeps_the_first_n_and_maps_the_rest_to_other():
    cap = CategoryCap(2)
    assert [cap(c) for c in ("code", "math", "code", "chat", None, "math")] == \
        ["code", "math", "code", OTHER_CATEGORY, OTHER_CATEGORY, "math"]
    assert cap.kept == {"code", "math"}


def test_dashboard_url_points_at_raygens_dashboard_for_the_run():
    env = {"RAY_GRAFANA_HOST": "http://grafana:3000", "RAY_GRAFANA_IFRAME_HOST": "http://localhost:3000/"}
    assert dashboard_url("r 1", "m/x", env) == \
        "http://localhost:3000/d/raygen-run?orgId=1&var-run=r+1&var-model=m%2Fx"
    assert dashboard_url("r", "m", {"RAY_GRAFANA_HOST": "http://g"}).startswith("http://g/d/raygen-run?")
    assert dashboard_url("r", "m", {}) is None
    assert dashboard_url("r", "m", {"RAY_GRAFANA_HOST": "DISABLED"}) is None


def test_dashboard_uid_matches_the_generated_dashboard():
    import json

    from jobs.runs.job_metrics import DASHBOARD_UID
    from tests.support.dashboards import DASHBOARD_JSON
    # The committed file Grafana loads, not the constant both import: the link must open it.
    assert DASHBOARD_UID == json.loads(DASHBOARD_JSON.read_text())["uid"] == "raygen-run"


ENGINE_TEXT = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 3.0
# TYPE sglang:generation_tokens counter
sglang:generation_tokens_total{model_name="m"} 120.0
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 2.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 5.0
sglang:time_to_first_token_seconds_sum{model_name="m"} 1.5
sglang:time_to_first_token_seconds_count{model_name="m"} 5.0
# TYPE process_cpu_seconds counter
process_cpu_seconds_total 9.0
"""


def test_engine_relay_forwards_every_sglang_sample_under_its_relay_name(monkeypatch):
    from serve_apps import replica_metrics

    made = record_gauges(monkeypatch, replica_metrics.metrics)
    relay = replica_metrics.EngineRelay()
    assert relay.relay(ENGINE_TEXT) == 6  # not the non-SGLang process metric
    g = {name: gauge for name, gauge in made.items() if name.startswith(mc.RELAY_PREFIX)}
    assert set(g) == {mc.relay_name(n) for n in (
        "sglang:num_running_reqs", "sglang:generation_tokens_total", "sglang:time_to_first_token_seconds_bucket",
        "sglang:time_to_first_token_seconds_sum", "sglang:time_to_first_token_seconds_count")}
    # Counters and buckets keep the engine's cumulative value and labels (le included).
    assert g["relay_sglang_generation_tokens_total"].values == {(("model_name", "m"),): 120.0}
    assert g["relay_sglang_time_to_first_token_seconds_bucket"].values == {
        (("le", "0.1"), ("model_name", "m")): 2.0, (("le", "+Inf"), ("model_name", "m")): 5.0}
    # A later sample with other label names is skipped, not an error (Ray rejects undeclared tags).
    assert relay.relay('sglang:num_running_reqs{model_name="m",tp_rank="0"} 1.0\n') == 0
    assert relay.relay('sglang:num_running_reqs{model_name="m"} 4.0\n') == 1
    assert g["relay_sglang_num_running_reqs"].values == {(("model_name", "m"),): 4.0}
    assert made["sglang_num_running_reqs"].values == {(("model_name", "m"),): 4.0}


def test_new_config_keys_are_validated_with_a_clear_error():
    from jobs.config import ConfigError, parse_config
    base = {"engine": {"kind": "simulator", "model_path": "sim-m"}, "job": {"input": "x.jsonl", "output": "/tmp/o", "run_name": "r"}}
    cfg = parse_config(base)
    assert cfg.job.truncation_alert_ratio == 0.10 and cfg.job.metrics_category_limit == 20
    for key, bad in (("truncation_alert_ratio", 1.5), ("truncation_alert_ratio", 0), ("metrics_category_limit", 0)):
        with pytest.raises(ConfigError, match=f"job.{key}"):
            parse_config({**base, "job": {**base["job"], key: bad}})
