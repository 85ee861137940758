"""Every cluster manifest starts Ray authenticated, and nothing listens on every interface
without the token.

Parsed from the files, not restated: every YAML file under cluster/ (ray up, each KubeRay
manifest, the NetworkPolicy, the monitoring files, runtime_env) and the local stack's own
`ray start`. Ray 2.60 authenticates when RAY_AUTH_MODE=token is in the environment of
`ray start` and a token is on the node (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or
~/.ray/auth_token); KubeRay (>= 1.6) does both for every Ray container with
``authOptions: {mode: token}``. A head is unauthenticated otherwise; a dashboard on
0.0.0.0 (``--dashboard-host``, which serves the Jobs API: it runs any code it is sent)
is refused unless the head is authenticated; any other 0.0.0.0 listener in the cluster
files is refused outright (Prometheus and Grafana have no token). The KubeRay
NetworkPolicy admits Ray's own pods to each other, the dashboard port only to the
operator, the RayJob submitter and a named namespace, the metrics port only to
Prometheus, and nothing to everyone.
"""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from cluster import local_stack

REPO = Path(__file__).resolve().parents[3]
CLUSTER = REPO / "cluster"
MANIFESTS = sorted([*CLUSTER.glob("*.yaml"), *CLUSTER.glob("kuberay/*.yaml"),
                    *CLUSTER.glob("kuberay/monitoring/*.yaml"), *CLUSTER.glob("prometheus/*.yml")])
EVERYWHERE = {"0.0.0.0", "::", "[::]"}
DASHBOARD_PORT, METRICS_PORT = 8265, 8080
RAY_POD = {"app.kubernetes.io/name": "raygen", "app.kubernetes.io/component": "ray"}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def _ray_start_flags(argv: list[str]) -> dict[str, Any]:
    """`ray start` flags as Ray's own CLI reads them (its defaults filled in)."""
    from ray.scripts.scripts import start
    return start.make_context("start", argv).params


# --- ray up -------------------------------------------------------------------------------

def _container_env(doc: dict) -> dict[str, str]:
    env = {}
    for option in doc.get("docker", {}).get("run_options", []):
        m = re.fullmatch(r"(?:--env|-e)[ =](\w+)=(\S*)", option.strip())
        if m:
            env[m.group(1)] = m.group(2)
    return env


def _shell_env(command: str, env: dict[str, str]) -> Iterator[tuple[dict[str, str], str]]:
    """(environment, simple command) for each `;`/`&&` part of one start command: `export`
    persists within the command, `VAR=value cmd` applies to that part only."""
    env = dict(env)
    for part in re.split(r"\s*(?:;|&&)\s*", command):
        words = shlex.split(part)
        if words[:1] == ["export"]:
            env.update(w.split("=", 1) for w in words[1:] if "=" in w)
            continue
        local = dict(env)
        while words and re.fullmatch(r"\w+=.*", words[0]):
            key, value = words.pop(0).split("=", 1)
            local[key] = value
        if words:
            yield local, " ".join(words)


def ray_up_problems(doc: dict) -> list[str]:
    problems = []
    container = _container_env(doc)
    token_on_nodes = any(remote.replace("$HOME", "~") == "~/.ray/auth_token"
                         for remote in (doc.get("file_mounts") or {}))
    starts = 0
    for role in ("head_start_ray_commands", "worker_start_ray_commands"):
        for command in doc.get(role, []):
            for env, simple in _shell_env(command, container):
                if not simple.startswith("ray start"):
                    continue
                starts += 1
                flags = _ray_start_flags(shlex.split(simple)[2:])
                authed = env.get("RAY_AUTH_MODE") == "token"
                has_token = token_on_nodes or env.get("RAY_AUTH_TOKEN") or env.get(
                    "RAY_AUTH_TOKEN_PATH")
                where = "head" if flags["head"] else "worker"
                if not authed:
                    problems.append(f"unauthenticated {where}: {simple}")
                elif not has_token:
                    problems.append(f"{where}: RAY_AUTH_MODE=token but no token on the node "
                                    f"(file_mounts ~/.ray/auth_token): ray start fails")
                if flags["head"] and flags["dashboard_host"] in EVERYWHERE and not authed:
                    problems.append(f"dashboard on {flags['dashboard_host']} without auth")
    if starts < 2:
        problems.append(f"found {starts} `ray start` commands, expected a head and a worker")
    return problems


# --- KubeRay ------------------------------------------------------------------------------

def cluster_specs(doc: dict) -> list[tuple[str, dict]]:
    kind, spec = doc.get("kind"), doc.get("spec", {})
    if kind == "RayCluster":
        return [(kind, spec)]
    if kind == "RayJob" and "rayClusterSpec" in spec:
        return [(kind, spec["rayClusterSpec"])]
    if kind == "RayService":
        return [(kind, spec["rayClusterConfig"])]
    return []


def _templates(spec: dict) -> Iterator[tuple[str, dict]]:
    yield "head", spec["headGroupSpec"]["template"]
    for group in spec.get("workerGroupSpecs", []):
        yield group["groupName"], group["template"]


def _env_auth(container: dict) -> bool:
    env = {e["name"]: e for e in container.get("env", [])}
    mode = env.get("RAY_AUTH_MODE", {}).get("value")
    token = env.get("RAY_AUTH_TOKEN", {})
    return mode == "token" and bool(token.get("valueFrom", {}).get("secretKeyRef"))


def kuberay_problems(name: str, spec: dict) -> list[str]:
    problems = []
    auth = (spec.get("authOptions") or {})
    by_operator = auth.get("mode", "token" if auth else None) == "token"
    by_env = all(_env_auth(c) for _, t in _templates(spec) for c in t["spec"]["containers"])
    authed = by_operator or by_env
    if not authed:
        problems.append(f"{name}: unauthenticated head (no authOptions.mode token, no "
                        f"RAY_AUTH_MODE/RAY_AUTH_TOKEN on every container)")
    version = tuple(int(x) for x in str(spec.get("rayVersion", "0")).split(".")[:2])
    if by_operator and version < (2, 52):
        problems.append(f"{name}: authOptions needs rayVersion >= 2.52 (got {version})")
    host = spec["headGroupSpec"].get("rayStartParams", {}).get("dashboard-host")
    if host in EVERYWHERE and not authed:
        problems.append(f"{name}: dashboard on {host} without auth")
    for group, template in _templates(spec):
        labels = template.get("metadata", {}).get("labels", {})
        if not RAY_POD.items() <= labels.items():
            problems.append(f"{name}/{group}: pod labels {labels} are not the NetworkPolicy's "
                            f"{RAY_POD}: the policy would not protect it")
    return problems


def _selects(selector: dict, labels: dict) -> bool:
    return selector.get("matchLabels", {}).items() <= labels.items() and not selector.get(
        "matchExpressions")


def networkpolicy_problems(policy: dict, submitter_labels: list[dict]) -> list[str]:
    spec = policy["spec"]
    problems = []
    if not _selects(spec["podSelector"], RAY_POD) or not spec["podSelector"].get("matchLabels"):
        problems.append(f"podSelector {spec['podSelector']} does not select the Ray pods")
    if "Ingress" not in spec.get("policyTypes", []):
        problems.append("policyTypes has no Ingress: nothing is fenced")
    dashboard_peers = []
    for rule in spec.get("ingress", []):
        peers, ports = rule.get("from"), {p.get("port") for p in rule.get("ports", [])}
        if not peers:
            problems.append(f"an ingress rule admits every source: {rule}")
            continue
        for peer in peers:
            if "ipBlock" in peer:
                problems.append(f"an ipBlock peer ({peer['ipBlock']}): by address, not by pod")
            namespace = peer.get("namespaceSelector")
            if namespace is not None and not namespace.get("matchLabels", {}).get(
                    "kubernetes.io/metadata.name"):
                problems.append(f"a namespaceSelector that is not one named namespace: {peer}")
            ray_pods_only = (namespace is None and "podSelector" in peer
                             and _selects({"matchLabels": RAY_POD}, peer["podSelector"].get(
                                 "matchLabels", {})))
            if not ports and not ray_pods_only:
                problems.append(f"all ports open to {peer}: only Ray's own pods get that")
            if DASHBOARD_PORT in ports:
                dashboard_peers.append(peer)
        if ports - {DASHBOARD_PORT, METRICS_PORT, None}:
            problems.append(f"ports {sorted(ports - {DASHBOARD_PORT, METRICS_PORT})} opened "
                            f"beyond the dashboard and metrics")
    pods = [p["podSelector"].get("matchLabels", {}) for p in dashboard_peers
            if "podSelector" in p and "namespaceSelector" not in p]
    for labels in submitter_labels:
        if not any(_selects({"matchLabels": sel}, labels) for sel in pods):
            problems.append(f"the RayJob submitter ({labels}) cannot reach the dashboard")
    if not any("namespaceSelector" in p and "podSelector" in p and "kuberay-operator" in str(
            p["podSelector"]) for p in dashboard_peers):
        problems.append("the KubeRay operator cannot reach the dashboard (RayJob, RayService)")
    return problems


# --- every manifest -----------------------------------------------------------------------

def _listeners_everywhere(path: Path) -> list[str]:
    """0.0.0.0 / :: in a file's non-comment text, other than a KubeRay dashboard-host (which
    kuberay_problems judges with the head's auth)."""
    found = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        code = line.split("#")[0]
        if re.search(r"dashboard-host:\s*\"?0\.0\.0\.0", code) and path.parent.name == "kuberay":
            continue
        if re.search(r"(?<![\d.])0\.0\.0\.0(?![\d.])|\[::\]|(?<![:\w])::(?![:\w])", code):
            found.append(f"{path.name}:{n}: {line.strip()}")
    return found


def manifest_problems(path: Path) -> list[str]:
    problems = _listeners_everywhere(path)
    docs = _docs(path)
    for doc in docs:
        if "head_start_ray_commands" in doc:
            problems += [f"{path.name}: {p}" for p in ray_up_problems(doc)]
        for kind, spec in cluster_specs(doc):
            problems += kuberay_problems(f"{path.name} ({kind})", spec)
    return problems


def test_every_cluster_manifest_is_read():
    kinds = {doc.get("kind") or ("ray up" if "head_start_ray_commands" in doc else None)
             for path in MANIFESTS for doc in _docs(path)}
    assert {"ray up", "RayCluster", "RayJob", "RayService", "NetworkPolicy"} <= kinds, kinds


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(CLUSTER)))
def test_every_manifest_runs_ray_authenticated_with_no_open_listener(path):
    assert manifest_problems(path) == []


def _kuberay_doc(name: str) -> dict:
    return yaml.safe_load((CLUSTER / "kuberay" / f"{name}.yaml").read_text())


def test_the_networkpolicy_fences_the_ray_pods():
    (policy,) = _docs(CLUSTER / "kuberay" / "networkpolicy.yaml")
    job = _kuberay_doc("rayjob")
    submitter = job["spec"]["submitterPodTemplate"]["metadata"]["labels"]
    assert networkpolicy_problems(policy, [submitter]) == []
    # The submitter is not a Ray pod: it gets the dashboard port, not the cluster's ports.
    assert not RAY_POD.items() <= submitter.items()


def test_every_kuberay_manifest_shares_one_token_secret():
    names = {spec["authOptions"].get("secretName") for path in CLUSTER.glob("kuberay/*.yaml")
             for doc in _docs(path) for _, spec in cluster_specs(doc)}
    assert names == {"raygen-ray-token"}
    assert "raygen-ray-token" in (CLUSTER / "README.md").read_text()


# --- the checkers find what breaks --------------------------------------------------------

def test_the_checkers_find_an_open_or_unauthenticated_head():
    up = yaml.safe_load((CLUSTER / "ray-up-b200.yaml").read_text())
    assert ray_up_problems(up) == []
    bare = copy.deepcopy(up)
    bare["docker"]["run_options"] = [o for o in bare["docker"]["run_options"]
                                     if "RAY_AUTH_MODE" not in o]
    bare["head_start_ray_commands"] = [c.replace("RAY_AUTH_MODE=token ", "").replace(
        "--dashboard-host=127.0.0.1", "--dashboard-host=0.0.0.0")
        for c in bare["head_start_ray_commands"]]
    problems = ray_up_problems(bare)
    assert any(p.startswith("unauthenticated head") for p in problems), problems
    assert any("dashboard on 0.0.0.0 without auth" in p for p in problems), problems
    no_token = copy.deepcopy(up)
    no_token["file_mounts"] = {}
    assert any("no token on the node" in p for p in ray_up_problems(no_token))

    spec = _kuberay_doc("raycluster")["spec"]
    assert kuberay_problems("raycluster", spec) == []
    open_spec = copy.deepcopy(spec)
    del open_spec["authOptions"]
    problems = kuberay_problems("raycluster", open_spec)
    assert any("unauthenticated head" in p for p in problems)
    assert any("dashboard on 0.0.0.0 without auth" in p for p in problems)
    unlabelled = copy.deepcopy(spec)
    del unlabelled["workerGroupSpecs"][0]["template"]["metadata"]
    assert any("would not protect it" in p for p in kuberay_problems("raycluster", unlabelled))


def test_the_checkers_find_an_open_networkpolicy_or_listener(tmp_path):
    (policy,) = _docs(CLUSTER / "kuberay" / "networkpolicy.yaml")
    wide = copy.deepcopy(policy)
    wide["spec"]["ingress"].append({"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
                                    "ports": [{"port": 10001}]})
    wide["spec"]["ingress"].append({})
    problems = networkpolicy_problems(wide, [])
    assert any("ipBlock" in p for p in problems)
    assert any("admits every source" in p for p in problems)
    assert any("ports [10001]" in p for p in problems)
    any_namespace = copy.deepcopy(policy)
    any_namespace["spec"]["ingress"][1]["from"][2]["namespaceSelector"] = {}
    assert any("not one named namespace" in p for p in networkpolicy_problems(any_namespace, []))
    listener = tmp_path / "x.yaml"
    listener.write_text("args: ['--web.listen-address=0.0.0.0:9090']\n"
                        "# a comment about 0.0.0.0 is fine\nhost: '::'\n")
    assert [p.split(": ", 1)[0] for p in _listeners_everywhere(listener)] == ["x.yaml:1",
                                                                              "x.yaml:3"]


# --- the local stack ----------------------------------------------------------------------

def test_the_local_stack_starts_its_head_authenticated_on_loopback(monkeypatch, tmp_path):
    ran = []
    monkeypatch.setattr(local_stack.subprocess, "run",
                        lambda argv, **kw: ran.append((argv, kw)))
    local_stack.start_head(str(tmp_path / "ray"), 48265, env={"HOME": str(tmp_path),
                                                               "PATH": "/usr/bin"})
    ((argv, kw),) = ran
    assert argv[:2] == [local_stack.RAY_BIN, "start"]
    flags = _ray_start_flags(argv[2:])
    assert flags["head"] and flags["dashboard_host"] == "127.0.0.1"
    assert kw["env"]["RAY_AUTH_MODE"] == "token"
    token = tmp_path / ".ray" / "auth_token"
    assert re.fullmatch(r"[0-9a-f]{64}", token.read_text())
    assert token.stat().st_mode & 0o777 == 0o600  # not readable by other local users
    # A second start keeps the token (clients hold it) and tightens a loose file.
    before = token.read_text()
    token.chmod(0o644)
    local_stack.start_head(str(tmp_path / "ray"), 48265, env={"HOME": str(tmp_path)})
    assert token.read_text() == before and token.stat().st_mode & 0o777 == 0o600
    assert manifest_problems(CLUSTER / "runtime_env.yaml") == []
