"""Every command the cluster files and the runbooks give a user resolves against the code.

Read from the files themselves, not restated: the shell code blocks of the README, the
docs its sections moved to (docs/*.md), cluster/README.md and cluster/monitoring.md, the
usage comments of cluster/*.yaml and cluster/kuberay/*.yaml, ray-up's start commands and the KubeRay entrypoints. For each
command: a `python -m MODULE` names a module that imports; raygen's own commands
(`python -m jobs...`, `raygen ...`) parse with raygen's parsers; `ray start` flags parse
with Ray's own CLI; every repository path a command names exists (`/app/...` is the
image's copy of the repo); the RayService's import_path builds its app from the shipped
config.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from jobs import cli

REPO = Path(__file__).resolve().parents[3]
CLUSTER = REPO / "cluster"
RUNBOOKS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), CLUSTER / "README.md",
            CLUSTER / "monitoring.md"]
MANIFESTS = sorted([*CLUSTER.glob("*.yaml"), *(CLUSTER / "kuberay").glob("*.yaml")])
# Folders of this repository that commands name files in.
REPO_DIRS = ("cluster/", "jobs/", "dashboards/", "serve_apps/", "contract/", "bench/",
             "docs/", "tests/")
OWN_PACKAGES = {"jobs", "serve_apps", "contract", "cluster", "dashboards", "bench", "tests"}
PLACEHOLDER = re.compile(r"^(<.*>|[A-Z][A-Z_]*|\$.*|.*YOUR_.*|\.\.\.)$")


def _joined(lines: list[str]) -> list[str]:
    text = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    return [line.strip() for line in text.splitlines() if line.strip()]


def _shell_blocks(text: str) -> Iterator[list[str]]:
    """The lines of every ```bash / ```sh / ```shell fenced block."""
    block, language = None, None
    for line in text.splitlines():
        fence = re.match(r"\s*```(\w*)", line)
        if fence and block is None:
            block, language = [], fence.group(1)
        elif fence:
            if language in ("bash", "sh", "shell"):
                yield block
            block = None
        elif block is not None:
            block.append(line)


def runbook_commands() -> Iterator[tuple[str, str]]:
    """(where, command line) of every shell block line in the runbooks."""
    for path in RUNBOOKS:
        for block in _shell_blocks(path.read_text()):
            for line in _joined(block):
                if not line.startswith("#"):
                    yield path.name, line.split(" # ")[0].strip()


def runbook_mentions() -> Iterator[tuple[str, str]]:
    """(where, span) of every inline `python -m jobs...` / `raygen SUB ...` with flags in
    the runbooks' prose and tables: the commands the tables tell users to run."""
    for path in RUNBOOKS:
        for span in re.findall(r"`((?:python -m jobs|raygen [a-z]+)[^`]* --[^`]+)`",
                               path.read_text()):
            yield path.name, span


def manifest_commands() -> Iterator[tuple[str, str]]:
    """(where, command) of every usage comment (`#   command ...`) in the cluster files."""
    for path in MANIFESTS:
        comments = [line[1:].strip() for line in path.read_text().splitlines()
                    if re.match(r"#\s{2,}\S", line)]
        for line in _joined(comments):
            if re.match(r"(ray|kubectl|python|raygen|helm|docker|cluster/|bash)\b", line):
                yield path.name, line.split(" # ")[0].strip()


def _module_parser(module: str) -> argparse.ArgumentParser | None:
    """raygen's own parser for `python -m module`, None for other modules."""
    mod = importlib.import_module(module)
    if not hasattr(mod, "add_args"):
        return None
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    mod.add_args(parser)
    return parser


class Refused(Exception):
    pass


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    def error(message: str):
        raise Refused(message)
    parser.error = error  # type: ignore[method-assign]
    for action in parser._actions:  # subparsers too
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.error = error  # type: ignore[method-assign]
    parser.parse_args(argv)


def check(command: str) -> list[str]:
    """What does not resolve in one command line (empty when all of it does)."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        return [f"cannot split: {exc}"]
    problems = []
    for token in argv:
        path = token.split("=", 1)[-1].removeprefix("/app/")
        if path.startswith(REPO_DIRS) and not PLACEHOLDER.match(path) and "*" not in path \
                and not (REPO / path).exists():
            problems.append(f"no such file in the repository: {path}")
    for i, token in enumerate(argv[:-1]):
        if token == "-m" and re.search(r"python3?$", argv[i - 1] if i else ""):
            module, args = argv[i + 1], argv[i + 2:]
            if module.split(".")[0] not in OWN_PACKAGES:
                continue  # another project's module (sglang, moto, ...): not ours to check
            base = REPO / module.replace(".", "/")
            if not (base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()):
                problems.append(f"no module {module} in the repository")
                continue
            parser = _module_parser(module) if module.startswith("jobs.") else None
            if parser is not None:
                try:
                    _parse(parser, [a for a in args if a != "..."])
                except Refused as exc:
                    problems.append(f"python -m {module}: {exc}")
    if argv[:1] == ["raygen"]:
        try:
            _parse(cli.build_parser(), [a for a in argv[1:] if a != "..."])
        except Refused as exc:
            problems.append(f"raygen: {exc}")
    return problems


def test_every_runbook_command_resolves():
    commands = list(runbook_commands())
    assert len(commands) > 30, commands  # the runbooks really were read
    assert any("python -m jobs.generate" in c for _, c in commands)
    assert any(c.startswith("raygen ") for _, c in commands)
    problems = [f"{where}: {command}\n    {p}" for where, command in commands
                for p in check(command)]
    assert not problems, "\n".join(problems)


def test_every_command_in_the_runbooks_tables_resolves():
    mentions = list(runbook_mentions())
    assert len(mentions) > 10, mentions
    problems = [f"{where}: {span}\n    {p}" for where, span in mentions for p in check(span)]
    assert not problems, "\n".join(problems)


def test_every_usage_comment_in_the_cluster_files_resolves():
    commands = list(manifest_commands())
    assert {where for where, _ in commands} >= {"ray-up-b200.yaml", "rayjob.yaml",
                                                 "runtime_env.yaml"}, commands
    problems = [f"{where}: {command}\n    {p}" for where, command in commands
                for p in check(command)]
    assert not problems, "\n".join(problems)


def test_the_checker_finds_what_breaks():
    assert check("python -m jobs.generate --config jobs/configs/nope.yaml")
    assert check("python -m jobs.generte --config jobs/configs/demo.yaml")
    assert check("raygen finalize --config jobs/configs/demo.yaml --allow-partal")
    assert check("python -m jobs.analysis.status s3://b/r --bogus")
    assert not check("raygen finalize --config jobs/configs/demo.yaml --allow-partial")
    assert not check("kubectl apply -f cluster/kuberay/rayjob.yaml")


def _ray_up() -> dict:
    return yaml.safe_load((CLUSTER / "ray-up-b200.yaml").read_text())


def _start_commands() -> list[str]:
    up = _ray_up()
    lines = up["head_start_ray_commands"] + up["worker_start_ray_commands"]
    return [part.strip() for line in lines for part in line.split(";") if part.strip()]


def test_ray_up_start_commands_parse_with_rays_own_cli():
    from ray.scripts.scripts import start
    starts = [c for c in _start_commands() if " ray start " in f" {c} "]
    assert len(starts) == 2
    for command in starts:
        argv = shlex.split(command[command.index("ray start") + len("ray start"):])
        start.make_context("start", argv)  # raises on an unknown or malformed flag
    others = [c for c in _start_commands() if "ray start" not in c]
    problems = [p for c in others for p in check(c)]
    assert not problems, problems
    # the monitoring script the head runs is in the image (cluster/ is copied to /app)
    assert any("/app/cluster/head_monitoring.sh" in c for c in others)


def test_kuberay_entrypoints_and_the_rayservice_app_resolve():
    job = yaml.safe_load((CLUSTER / "kuberay" / "rayjob.yaml").read_text())
    assert check(job["spec"]["entrypoint"]) == []
    service = yaml.safe_load((CLUSTER / "kuberay" / "rayservice.yaml").read_text())
    (app,) = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    module, _, attr = app["import_path"].partition(":")
    builder = getattr(importlib.import_module(module), attr)
    config = str(REPO / app["args"]["config"].removeprefix("/app/"))
    from ray.serve.deployment import Application
    assert isinstance(builder({"config": config}), Application)


@pytest.mark.parametrize("where, command", list(manifest_commands()))
def test_manifest_usage_lines_are_found(where, command):
    assert command  # each usage line is a command the checker reads (listed per file)
