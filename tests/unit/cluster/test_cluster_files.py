"""cluster/ files agree with each other, with the run config and with the code.

What must not drift apart on a real cluster: GPUs per node (8) vs the run's Serve
replicas (one per GPU), the pinned image tag, the Ray version, the job's entry point
and config path, the runtime env (what is uploaded, which env vars), the region, and
the runbook's commands vs the CLIs. Ray's own validators are used where Ray has them
(cluster-launcher schema, ServeDeploySchema, RuntimeEnv, working_dir packaging).
"""

from __future__ import annotations

import importlib
import re
import shlex
import tomllib
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

import pytest
import yaml

from jobs.config import load_config
from jobs.generate import parse_args as generate_args
from serve_apps.app import deployment_options

REPO = Path(__file__).resolve().parents[3]
CLUSTER = REPO / "cluster"
RAY_UP = CLUSTER / "ray-up-b200.yaml"
KUBERAY = {kind: CLUSTER / "kuberay" / f"{kind}.yaml"
           for kind in ("raycluster", "rayjob", "rayservice")}
RUNTIME_ENV = CLUSTER / "runtime_env.yaml"
DOCKERFILE = CLUSTER / "Dockerfile"
RUNBOOK = CLUSTER / "README.md"
QWEN = "jobs/configs/qwen36-27b-b200.yaml"
GPUS_PER_NODE = 8
IMAGE_IN_APP = "/app"  # WORKDIR of cluster/Dockerfile: the repo's files live under it


def _yaml(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _pin(name: str) -> str:
    project = _pyproject()["project"]
    deps = project["dependencies"] + [d for ds in project["optional-dependencies"].values()
                                      for d in ds]
    for dep in deps:
        m = re.fullmatch(rf"{re.escape(name)}(\[[^\]]*\])?==([\w.]+)", dep)
        if m:
            return m.group(2)
    raise AssertionError(f"{name} is not pinned in pyproject.toml")


def _cluster_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    """(file, RayClusterSpec) of every KubeRay manifest."""
    yield "raycluster", _yaml(KUBERAY["raycluster"])["spec"]
    yield "rayjob", _yaml(KUBERAY["rayjob"])["spec"]["rayClusterSpec"]
    yield "rayservice", _yaml(KUBERAY["rayservice"])["spec"]["rayClusterConfig"]


def _containers(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    yield "head", spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    for group in spec["workerGroupSpecs"]:
        yield group["groupName"], group["template"]["spec"]["containers"][0]


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def _qwen():
    return load_config(str(REPO / QWEN))


# --- ray up -------------------------------------------------------------------------------

def test_ray_up_config_passes_rays_own_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config
    validate_config(prepare_config(_yaml(RAY_UP)))


def test_every_ray_up_node_is_an_8xb200_node():
    types = _yaml(RAY_UP)["available_node_types"]
    assert types, "no node types"
    for name, node in types.items():
        assert node["resources"]["GPU"] == GPUS_PER_NODE, name
        assert node["resources"].get("accelerator_type:B200") == 1, name
        assert node["node_config"]["InstanceType"] == "p6-b200.48xlarge", name
        assert "IamInstanceProfile" in node["node_config"], f"{name}: S3 access needs a profile"


# --- KubeRay ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(KUBERAY))
def test_kuberay_manifest_shape(kind):
    doc = _yaml(KUBERAY[kind])
    assert doc["apiVersion"] == "ray.io/v1"
    assert doc["kind"] == {"raycluster": "RayCluster", "rayjob": "RayJob",
                           "rayservice": "RayService"}[kind]


@pytest.mark.parametrize("kind", sorted(KUBERAY))
def test_kuberay_gpu_pods_have_8_gpus_and_the_head_none(kind):
    spec = dict(_cluster_specs())[kind]
    assert spec["rayVersion"] == _pin("ray")
    for group, container in _containers(spec):
        res = container["resources"]
        gpus = {k: str(v.get("nvidia.com/gpu", "0")) for k, v in res.items()}
        want = "0" if group == "head" else str(GPUS_PER_NODE)
        assert gpus == {"requests": want, "limits": want}, f"{kind}/{group}: {gpus}"
    for group in spec["workerGroupSpecs"]:
        selector = group["template"]["spec"]["nodeSelector"]
        assert selector == {"nvidia.com/gpu.product": "NVIDIA-B200"}, kind
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], kind


# --- the run config vs the clusters -------------------------------------------------------

def test_qwen_config_runs_sglang_with_one_gpu_per_replica():
    cfg = _qwen()
    assert cfg.engine.kind == "sglang"
    assert deployment_options(cfg.engine, cfg.serve)["ray_actor_options"]["num_gpus"] == 1
    assert cfg.engine.speculative is not None and cfg.engine.speculative.algorithm == "NEXTN"


def test_replicas_fill_exactly_one_node_and_every_cluster_can_host_them():
    scaling = _qwen().serve.autoscaling
    # The config is for one 8-GPU node: a fixed fleet of 8 replicas (8 x nodes in general).
    assert scaling.min_replicas == scaling.max_replicas == GPUS_PER_NODE * 1
    up = _yaml(RAY_UP)
    capacity = GPUS_PER_NODE * (1 + up["max_workers"])  # the head is a GPU node too
    assert scaling.max_replicas <= capacity
    for kind, spec in _cluster_specs():
        groups = spec["workerGroupSpecs"]
        assert scaling.max_replicas <= GPUS_PER_NODE * sum(g["maxReplicas"] for g in groups), kind
    # The job's and the service's own clusters start with exactly the fleet's GPUs.
    for kind in ("rayjob", "rayservice"):
        spec = dict(_cluster_specs())[kind]
        assert GPUS_PER_NODE * sum(g["minReplicas"] for g in spec["workerGroupSpecs"]) \
            == scaling.max_replicas, kind


def test_qwen_config_and_runbook_state_the_prompt_limits_raygen_enforces():
    """The longest prompt each pass takes, as the replica's context guard computes it (the
    reserve as SGLang resolves it), is what the config's comments and the runbook say."""
    from contract.outcomes import ContextOverflow
    from serve_apps.generation import Generator

    run = _qwen()
    engine, budget = run.engine, run.job.max_new_tokens
    total = 2 * budget  # the runbook's --continue-truncated --max-total-tokens
    assert f"--max-total-tokens {total}" in RUNBOOK.read_text()
    guard = Generator(client=None, context_length=engine.context_length, think_end="</think>",
                      replica_id="r", engine_alive=lambda: True,
                      reserved_tokens=engine.reserved_tokens)
    limits = {}
    for name, generated, asked in (("first", 0, budget), ("continued", budget, total - budget)):
        # prompt + what it already generated goes in; the rest of the new total is asked
        n = engine.context_length - generated - asked - engine.reserved_tokens
        assert guard.fit_budget(n + generated, asked, "reject") == asked
        with pytest.raises(ContextOverflow):
            guard.fit_budget(n + 1 + generated, asked, "reject")
        limits[name] = n
    text = (REPO / QWEN).read_text()
    c, r = engine.context_length, engine.reserved_tokens
    assert f"prompts up to {limits['first']} tokens run ({c} - {budget} - {r})" in text
    assert f"prompts up to {limits['continued']} tokens ({c} - {total} - {r})" in text
    runbook = " ".join(RUNBOOK.read_text().split())
    assert f"leaves prompts up to {limits['continued']:,} tokens" in runbook
    assert f"takes prompts up to {limits['first']:,} tokens" in runbook


def test_qwen_config_claims_the_replica_count_it_runs():
    """A throughput claim names the GPU count the config runs, not the story's 7."""
    replicas = _qwen().serve.autoscaling.min_replicas
    text = " ".join(line.lstrip("# ") for line in (REPO / QWEN).read_text().splitlines())
    assert f"This file runs {replicas} (one node)" in text
    assert f"25,000 / 7 x {replicas}" in text
    assert f"{replicas} replicas on one 8xB200 node" in " ".join(RUNBOOK.read_text().split())


# --- image, versions ----------------------------------------------------------------------

def _all_images() -> dict[str, str]:
    images = {"ray-up": _yaml(RAY_UP)["docker"]["image"]}
    for kind, spec in _cluster_specs():
        for group, container in _containers(spec):
            images[f"{kind}/{group}"] = container["image"]
    build = re.search(r"docker build (?:--build-arg \S+ )*-f cluster/Dockerfile -t (\S+) \.",
                      DOCKERFILE.read_text())
    assert build, "cluster/Dockerfile should show its `docker build ... -t <tag>` command"
    images["Dockerfile"] = build.group(1)
    return images


def test_one_pinned_image_everywhere():
    images = _all_images()
    assert len(set(images.values())) == 1, images
    image = next(iter(images.values()))
    name, _, tag = image.rpartition(":")
    assert name and tag and tag != "latest" and "/" not in tag, image
    version = _pyproject()["project"]["version"]
    assert tag == f"{version}-sglang{_pin('sglang')}", f"tag {tag} should name raygen {version}"
    assert image in RUNBOOK.read_text()


def test_dockerfile_builds_from_the_pinned_sglang_image():
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG SGLANG_IMAGE=(\S+)$", text, re.M)
    # Published tags carry the CUDA build: v0.5.23-cu130, never a bare v0.5.23.
    assert base and re.fullmatch(rf"lmsysorg/sglang:v{re.escape(_pin('sglang'))}-cu\d+",
                                 base.group(1)), base
    # Pinned by digest: the build cannot run on a tag alone.
    assert re.search(r"^ARG SGLANG_DIGEST$", text, re.M)
    assert re.search(r"^FROM \$\{SGLANG_IMAGE\}@\$\{SGLANG_DIGEST\}$", text, re.M)
    # raygen never moves a base-image package, and pip check fails the build.
    assert "pip freeze" in text and "pip install --no-cache-dir -c /tmp/base-constraints.txt ." in text
    check = re.search(r"pip check(.*)$", text, re.M)
    assert check and "||" not in check.group(1), "pip check must fail the build"
    for src in re.findall(r"^COPY (\S+) ", text, re.M):
        assert (REPO / src).exists(), f"Dockerfile copies {src}, which does not exist"
    assert re.search(r"^WORKDIR /app$", text, re.M)


# --- entry point and runtime env ----------------------------------------------------------

def test_rayjob_entrypoint_is_the_generate_cli_with_a_loadable_config():
    spec = _yaml(KUBERAY["rayjob"])["spec"]
    argv = shlex.split(spec["entrypoint"])
    assert argv[:5] == ["python", "-m", "jobs.generate", "--config", QWEN] and len(argv) == 5
    args = generate_args(argv[3:])
    assert (REPO / args.config).is_file()
    load_config(str(REPO / args.config))
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert runtime_env["working_dir"] == IMAGE_IN_APP  # where the config path resolves


def test_runtime_env_is_valid_and_kuberay_carries_the_same_env_vars():
    from ray.runtime_env import RuntimeEnv
    env = _yaml(RUNTIME_ENV)
    RuntimeEnv(**env)
    assert all(isinstance(v, str) for v in env["env_vars"].values())
    job_env = yaml.safe_load(_yaml(KUBERAY["rayjob"])["spec"]["runtimeEnvYAML"])
    assert job_env["env_vars"] == env["env_vars"]
    app = _serve_app()
    assert env["env_vars"].items() <= app["runtime_env"]["env_vars"].items()


def test_runtime_env_upload_leaves_out_venv_and_local_state(tmp_path):
    # Ray's own packaging function, on a tree shaped like the repo.
    from ray._private.runtime_env.packaging import _zip_files
    for rel in (".venv/lib/python3.11/site-packages/ray/__init__.py", ".local/s3/blob",
                ".git/HEAD", "serve_apps/__pycache__/app.cpython-311.pyc",
                "raygen.egg-info/PKG-INFO",
                "tests/unit/test_x.py", "serve_apps/app.py", QWEN, "jobs/generate.py"):
        (tmp_path / "repo" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "repo" / rel).write_text("x")
    _zip_files(str(tmp_path / "repo"), _yaml(RUNTIME_ENV)["excludes"], str(tmp_path / "p.zip"),
               include_gitignore=False)
    names = set(zipfile.ZipFile(tmp_path / "p.zip").namelist())
    assert names == {"serve_apps/app.py", QWEN, "jobs/generate.py"}, names


def test_cache_dir_and_region_agree_everywhere():
    env = _yaml(RUNTIME_ENV)["env_vars"]
    hf_home = PurePosixPath(env["HF_HOME"])
    assert re.search(rf"^ENV HF_HOME={hf_home} ", DOCKERFILE.read_text(), re.M)
    up = _yaml(RAY_UP)
    mounts = [opt.split()[1].split(":")[1] for opt in up["docker"]["run_options"]
              if opt.startswith("-v ")]
    assert any(hf_home.is_relative_to(m) for m in mounts), (hf_home, mounts)
    for kind, spec in _cluster_specs():
        for group, container in _containers(spec):
            assert _env(container)["AWS_DEFAULT_REGION"] == env["AWS_DEFAULT_REGION"], kind
            if group == "head":
                continue
            assert _env(container)["HF_HOME"] == str(hf_home), kind
            paths = [m["mountPath"] for m in container["volumeMounts"]]
            assert any(hf_home.is_relative_to(p) for p in paths), (kind, paths)
            assert "/dev/shm" in paths, kind
    assert up["provider"]["region"] == env["AWS_DEFAULT_REGION"] == _qwen().storage.region


# --- RayService ---------------------------------------------------------------------------

def _serve_app() -> dict[str, Any]:
    config = yaml.safe_load(_yaml(KUBERAY["rayservice"])["spec"]["serveConfigV2"])
    (app,) = config["applications"]
    return app


def test_rayservice_serves_the_qwen_app_the_job_attaches_to():
    from ray.serve.schema import ServeDeploySchema
    ServeDeploySchema.model_validate(
        yaml.safe_load(_yaml(KUBERAY["rayservice"])["spec"]["serveConfigV2"]))
    app = _serve_app()
    # The deployment class is serve_apps.engine_deployment:EngineDeployment; Serve builds
    # the application around it with serve_apps.app:build_app_from_env.
    assert app["import_path"] == "serve_apps.app:build_app_from_env"
    assert app["name"] == _qwen().serve.app_name  # same name: the job attaches, not redeploys
    for path in (app["args"]["config"], app["runtime_env"]["env_vars"]["RAYGEN_CONFIG"]):
        rel = PurePosixPath(path).relative_to(IMAGE_IN_APP)
        assert str(rel) == QWEN, path


# --- secrets and the runbook --------------------------------------------------------------

SECRET = re.compile(r"AKIA[0-9A-Z]{16}|aws_secret_access_key|AWS_SECRET_ACCESS_KEY|"
                    r"HF_TOKEN\s*[:=]\s*\S|hf_[A-Za-z0-9]{30,}|password\s*[:=]", re.I)


def test_no_secrets_inline():
    files = [RAY_UP, RUNTIME_ENV, DOCKERFILE, REPO / QWEN, *KUBERAY.values()]
    for path in files:
        assert not SECRET.search(path.read_text()), f"{path} looks like it holds a secret"


def _runbook_commands(module: str) -> list[list[str]]:
    text = re.sub(r"\\\n\s*", " ", RUNBOOK.read_text())  # join continued lines
    found = []
    for line in text.splitlines():
        at = line.find(f"python -m {module} ")
        if at >= 0:
            found.append(shlex.split(line[at:].split("#")[0])[3:])
    return found


def test_runbook_generate_commands_parse():
    commands = _runbook_commands("jobs.generate")
    flags = {a for argv in commands for a in argv if a.startswith("--")}
    assert {"--config", "--retry-failed", "--continue-truncated", "--max-total-tokens"} <= flags
    for argv in commands:
        generate_args(argv)


@pytest.mark.parametrize("module", ["jobs.analysis.status", "jobs.analysis.report", "jobs.analysis.finalize"])
def test_runbook_run_commands_match_their_cli(module, capsys):
    commands = _runbook_commands(module)
    assert commands, f"the runbook never shows {module}"
    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(module).main(["--help"])
    assert exit_.value.code == 0
    helptext = capsys.readouterr().out
    for argv in commands:
        positional = [a for a in argv if not a.startswith("-")]
        assert positional and positional[0].startswith(("s3://", "<", "$")), argv
        for flag in (a.split("=")[0] for a in argv if a.startswith("--")):
            assert flag in helptext, f"{module} has no {flag}"
