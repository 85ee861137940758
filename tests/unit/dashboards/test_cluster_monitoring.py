"""Monitoring wiring in cluster/: ray up and KubeRay point Ray at Prometheus/Grafana,
scrape every Ray pod/node with the SGLang relabel rule, and provision exactly the
rules and dashboard this repo builds; cluster/monitoring.md names only real files."""

from __future__ import annotations

import re


from dashboards import build
from dashboards import metrics_catalog as mc

from tests.support.dashboards import PROM_CONFIG, REPO, load_yaml

CLUSTER = REPO / "cluster"
RAY_UP = CLUSTER / "ray-up-b200.yaml"
HEAD_SCRIPT = CLUSTER / "head_monitoring.sh"
MONITORING_MD = CLUSTER / "monitoring.md"
KUBE = CLUSTER / "kuberay"
MON = KUBE / "monitoring"
RAY_ENV = ("RAY_PROMETHEUS_HOST", "RAY_GRAFANA_HOST", "RAY_GRAFANA_IFRAME_HOST")


def _camel(rule: dict) -> dict:
    return {re.sub(r"_(\w)", lambda m: m.group(1).upper(), k): v for k, v in rule.items()}


def _kube_heads_and_workers():
    for kind in ("raycluster", "rayjob", "rayservice"):
        doc = load_yaml(KUBE / f"{kind}.yaml")
        spec = {"raycluster": lambda d: d["spec"], "rayjob": lambda d: d["spec"]["rayClusterSpec"],
                "rayservice": lambda d: d["spec"]["rayClusterConfig"]}[kind](doc)
        yield kind, "head", spec["headGroupSpec"]["template"]["spec"]["containers"][0]
        for group in spec["workerGroupSpecs"]:
            yield kind, group["groupName"], group["template"]["spec"]["containers"][0]


def test_ray_up_head_exports_rays_monitoring_env_and_starts_prometheus_and_grafana():
    cmds = load_yaml(RAY_UP)["head_start_ray_commands"]
    (start,) = [c for c in cmds if "ray start --head" in c]
    exports = start[:start.index("ray start --head")]
    for var in RAY_ENV + ("RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR",):
        assert f"{var}=" in exports, f"{var} must be set for `ray start --head`"
    folder = re.search(r"RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR=(\S+?);", start).group(1)
    # After Ray's head (which writes the grafana.ini the script needs), with the same folder.
    assert cmds.index(start) < len(cmds) - 1
    monitoring = cmds[-1]
    assert f"RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR={folder}" in monitoring
    assert monitoring.split()[-2:] == ["/app/cluster/head_monitoring.sh", "start"]
    # /app/cluster in the image is this repo's cluster/ folder.
    dockerfile = (CLUSTER / "Dockerfile").read_text()
    assert re.search(r"^WORKDIR /app$", dockerfile, re.M) and re.search(r"^COPY cluster \./cluster$", dockerfile, re.M)


def test_scrape_config_renames_relayed_sglang_metrics():
    (job,) = load_yaml(PROM_CONFIG)["scrape_configs"]
    assert job["metric_relabel_configs"] == [mc.SGLANG_RELABEL]
    rule = mc.SGLANG_RELABEL
    # Prometheus anchors the regex and expands $1 like re's \1.
    assert re.sub(rf"^{rule['regex']}$", rule["replacement"].replace("$1", r"\1"),
                  "ray_relay_sglang_time_to_first_token_seconds_bucket") == "sglang:time_to_first_token_seconds_bucket"
    assert not re.fullmatch(rule["regex"], "ray_raygen_output_tokens_total")
    # The copy Ray's Serve LLM SGLang dashboard reads keeps Ray's name.
    assert not re.fullmatch(rule["regex"], "ray_sglang_time_to_first_token_seconds_bucket")


def test_kuberay_heads_point_ray_at_kube_prometheus_stack():
    values = (MON / "kube-prometheus-stack-values.yaml").read_text()
    release, namespace = "prometheus", "prometheus-system"
    assert f"helm install {release} " in values and f"--namespace {namespace}" in values
    for kind, group, container in _kube_heads_and_workers():
        if group != "head":
            continue
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["RAY_PROMETHEUS_HOST"] == f"http://{release}-kube-prometheus-prometheus.{namespace}.svc:9090", kind
        assert env["RAY_GRAFANA_HOST"] == f"http://{release}-grafana.{namespace}.svc:80", kind
        assert env["RAY_GRAFANA_IFRAME_HOST"].startswith("http://127.0.0.1:"), kind


def test_podmonitor_scrapes_every_ray_pods_metrics_port_with_the_relabel_rule():
    pm = load_yaml(MON / "podmonitor.yaml")
    assert pm["kind"] == "PodMonitor" and pm["metadata"]["labels"]["release"] == build.KUBE_RELEASE_LABELS["release"]
    assert pm["spec"]["selector"]["matchLabels"] == {"ray.io/is-ray-node": "yes"}
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["metricRelabelings"] == [_camel(mc.SGLANG_RELABEL)]
    assert endpoint["interval"] == load_yaml(PROM_CONFIG)["global"]["scrape_interval"]
    for kind, group, container in _kube_heads_and_workers():
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports.get(endpoint["port"]) == 8080, (kind, group, ports)


def test_kube_prometheus_rule_and_dashboard_are_the_ones_the_repo_builds():
    assert not {build.KUBE_RULE_YML, build.KUBE_DASHBOARD_YML} & set(build.stale_files()), \
        "run `python -m dashboards.build`"
    rule = load_yaml(build.KUBE_RULE_YML)
    assert rule["kind"] == "PrometheusRule" and rule["metadata"]["labels"]["release"] == "prometheus"
    assert rule["spec"] == load_yaml(build.RULES_YML)
    cm = load_yaml(build.KUBE_DASHBOARD_YML)
    values = load_yaml(MON / "kube-prometheus-stack-values.yaml")
    sidecar_label = values["grafana"]["sidecar"]["dashboards"]["label"]
    assert cm["metadata"]["labels"][sidecar_label] == "1"
    assert cm["data"] == {"raygen.json": build.DASHBOARD_JSON.read_text()}
    assert values["grafana"]["grafana.ini"]["security"]["allow_embedding"] is True


def test_monitoring_doc_names_only_files_that_exist():
    text = MONITORING_MD.read_text()
    paths = set(re.findall(r"`((?:cluster|dashboards|jobs)/[\w./-]+\.(?:ya?ml|sh|md|json|py))`", text))
    assert {"cluster/ray-up-b200.yaml", "cluster/head_monitoring.sh", "cluster/kuberay/monitoring/podmonitor.yaml",
            "cluster/kuberay/monitoring/prometheusrule.yaml",
            "cluster/kuberay/monitoring/grafana-dashboard.yaml"} <= paths, paths
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"cluster/monitoring.md names missing files: {missing}"
