"""The image's dependency set resolves: raygen's pins and SGLang 0.5.23's declared
requirements, together, by pip's own resolver, and the Dockerfile installs that set.

cluster/image-requirements.txt is the set (`python -m cluster.image_lock` writes it).
Without the network: the lock holds every pin of pyproject.toml at its version and
sglang==0.5.23, and the Dockerfile installs raygen with the lock as constraints (beside
the base image's `pip freeze`) from the image's own tree, then runs `pip check`. With
PyPI: pip's resolver (dry run, metadata only: nothing downloaded past the metadata,
nothing installed) resolves raygen's pins and the gpu extra again, the lock as
constraints, and must pick exactly the lock's set; a pin changed without the lock
regenerated fails there too, with pip's account of the conflict. Skipped, saying so, when
PyPI cannot be reached in 5 s. (Why constraints and not a fresh resolution that must
equal the lock: cluster/image_lock.py.)
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from cluster import image_lock
from tests.contract.cluster.test_image_tree import _instructions, assemble

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "cluster" / "Dockerfile"
LOCK_IN_IMAGE = "cluster/image-requirements.txt"  # relative to the image's WORKDIR


def pin_problems(pins: dict[str, str], lock: dict[str, str]) -> list[str]:
    return [f"{name}: pyproject.toml {version}, lock {lock.get(name, 'missing')}"
            for name, version in sorted(pins.items()) if lock.get(name) != version]


def test_the_lock_holds_every_raygen_pin_and_sglang():
    pins = image_lock.pins()
    lock = image_lock.read_lock()
    assert {"ray", "numpy", "pandas", "sglang"} <= pins.keys(), pins
    assert pin_problems(pins, lock) == [], (
        "cluster/image-requirements.txt is stale: run `python -m cluster.image_lock`")
    assert lock["sglang"] == "0.5.23"
    assert len(lock) > len(pins)  # SGLang's own requirements are in it, not just the pins


def test_a_pin_the_lock_lacks_is_named(tmp_path):
    pinned = f'"numpy=={image_lock.pins()["numpy"]}"'
    text = image_lock.PYPROJECT.read_text()
    assert pinned in text
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(text.replace(pinned, '"numpy==9.9.9"'))
    lock = image_lock.read_lock()
    assert pin_problems(image_lock.pins(pyproject), lock) == [
        f"numpy: pyproject.toml 9.9.9, lock {lock['numpy']}"]
    assert image_lock.differences({"a": "1", "b": "2", "c": "1"},
                                  {"a": "1", "b": "3", "d": "4"}) == [
        "b: lock 2, pip 3", "c==1: in the lock, not in pip's resolution",
        "d==4: pip resolves it, the lock lacks it"]


def _install_run() -> list[list[str]]:
    """The commands (split on &&) of the Dockerfile's RUN that pip-installs raygen."""
    runs = [[shlex.split(c) for c in args.split("&&")]
            for word, args in _instructions(DOCKERFILE.read_text()) if word == "RUN"]
    (run,) = [r for r in runs if any(argv[:4] == ["python", "-m", "pip", "install"]
                                     for argv in r)]
    return run


def test_the_dockerfile_installs_raygen_with_the_lock_as_constraints(tmp_path):
    run = _install_run()
    (install,) = [argv for argv in run if argv[:4] == ["python", "-m", "pip", "install"]]
    constraints = [install[i + 1] for i, a in enumerate(install[:-1]) if a == "-c"]
    assert constraints == ["/tmp/base-constraints.txt", LOCK_IN_IMAGE], install
    positional = [a for i, a in enumerate(install[4:], 4)
                  if not a.startswith("-") and install[i - 1] != "-c"]
    assert positional == ["."] and "--no-deps" not in install, install
    assert run.index(install) < run.index(["python", "-m", "pip", "check"]), run
    # The lock reaches the image from the build context, where the RUN reads it.
    app = assemble(DOCKERFILE.read_text(), tmp_path / "image")
    assert (app / LOCK_IN_IMAGE).read_text() == image_lock.LOCK.read_text()


def test_an_index_that_does_not_answer_is_a_reason_to_skip(monkeypatch):
    monkeypatch.setattr(image_lock, "INDEX", "https://127.0.0.1:9/simple/")
    assert "not reachable in 5 s" in image_lock.index_reachable(timeout=5)


@pytest.mark.slow
@pytest.mark.pypi
def test_pips_resolver_picks_exactly_the_lock():
    unreachable = image_lock.index_reachable(timeout=5)
    if unreachable:
        pytest.skip(f"cannot re-resolve the image's set: {unreachable}")
    try:
        resolved = image_lock.resolve(constraints=image_lock.LOCK, timeout=300)
    except image_lock.ResolutionFailed as exc:
        pytest.fail("pip's resolver rejects cluster/image-requirements.txt with pyproject.toml's "
                    f"pins (regenerate it: python -m cluster.image_lock):\n{exc}")
    differences = image_lock.differences(image_lock.read_lock(), resolved)
    assert differences == [], "cluster/image-requirements.txt is not pip's resolution " \
                              "(python -m cluster.image_lock):\n" + "\n".join(differences)
