"""cluster/prometheus/prometheus.yml: raygen's rules, Ray's scrape interval and SD file."""

from __future__ import annotations

from tests.support.dashboards import PROM_CONFIG, RULES, load_yaml


def test_config_loads_raygen_rules_and_scrapes_at_rays_report_interval_with_a_full_timeout():
    cfg = load_yaml(PROM_CONFIG)
    assert cfg["global"]["scrape_interval"] == "10s" and cfg["global"]["evaluation_interval"] == "5s"
    # A big node page must not time out (the cause of test_metrics_live's order dependence).
    assert cfg["global"]["scrape_timeout"] == cfg["global"]["scrape_interval"]
    rule_files = [(PROM_CONFIG.parent / f).resolve() for f in cfg["rule_files"]]
    assert RULES.resolve() in rule_files


def test_config_reads_rays_service_discovery_file():
    from ray._private import ray_constants  # the name Ray 2.60 writes, not a guess

    (job,) = [j for j in load_yaml(PROM_CONFIG)["scrape_configs"] if j["job_name"] == "ray"]
    files = [f for sd in job["file_sd_configs"] for f in sd["files"]]
    assert files == [f"/tmp/ray/{ray_constants.PROMETHEUS_SERVICE_DISCOVERY_FILE}"]
