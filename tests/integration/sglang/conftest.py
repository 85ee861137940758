"""One pool of real SGLang engines for this folder: two Serve replicas, each
supervising ``python -m sglang.launch_server`` on the scripted model, on SGLang's CPU
engine (``engine.device: cpu``); and ``spec_pool``, one more engine of the same model with
speculative decoding on (STANDALONE, drafted by the ``draft`` model), for the tests of
what SGLang's speculation decides; and ``small_pool``, one engine of the same model whose
KV pool is too small for the rows it is given (the smoke's capacity trial and the
simulator's KV-pool differential). The folder is one xdist scope
(tests/support/xdist_scopes.py), so the pool starts once per `make test` (~25 s, ~2 GB
an engine) and stops after the folder's last test; every test here attaches to it through
the same engine section (tests/support/sglang_cpu.py, helpers.sglang_config). A test that kills an engine
waits for Serve's replacement before it returns, so the pool is whole for the next.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from serve_apps.engines.sglang_cpu import models
from tests.integration.helpers import (deploy, engine_urls, sglang_config,
                                      sglang_small_pool_config, sglang_spec_config, write_prompts)
from tests.support import sglang_cpu

REPLICAS = 2


@dataclass(frozen=True)
class Pool:
    model: str  # the scripted model's folder

    @property
    def urls(self) -> list[str]:
        """The engines' own HTTP endpoints behind the replicas, asked now (a replaced
        replica's engine listens on a new port)."""
        return engine_urls(sglang_cpu.APP, REPLICAS, timeout_s=120)


@contextmanager
def _deployed_for_the_folder(tree: dict, app: str) -> Iterator[None]:
    """``tree``'s app deployed, then deleted when the folder is done (not blocking: its
    replicas stop their engines while the next test runs)."""
    from ray import serve
    deploy(tree)
    try:
        yield
    finally:
        try:
            serve.delete(app, _blocking=False)
        except Exception:  # noqa: BLE001 - a cleanup, never a test failure
            pass


@pytest.fixture(scope="session")
def scripted_model() -> str:
    return str(models.ensure("scripted"))


# Package scope: the pool stops when the folder's last test is done. The folder runs first
# (tests/support/xdist_scopes.py LONGEST_FIRST), and two idle real engines (~2 GB each,
# their schedulers polling) otherwise stayed up for the rest of the run beside every other
# test on this 2-core machine.
@pytest.fixture(scope="package")
def sglang_pool(ray_cluster, s3_endpoint, scripted_model, tmp_path_factory) -> Iterator[Pool]:
    tmp = tmp_path_factory.mktemp("sglang-pool")
    tree = sglang_config(tmp, s3_endpoint, rows_file=str(write_prompts(tmp / "p.jsonl", 1)),
                         model_path=scripted_model)
    with _deployed_for_the_folder(tree, sglang_cpu.APP):
        pool = Pool(model=scripted_model)
        assert len(pool.urls) == REPLICAS
        yield pool


@dataclass(frozen=True)
class SpecPool:
    model: str  # the scripted model's folder (the target)
    draft: str  # the draft model's folder

    @property
    def url(self) -> str:
        return engine_urls(sglang_cpu.SPEC_APP, 1, timeout_s=120)[0]


@pytest.fixture(scope="session")
def draft_model() -> str:
    return str(models.ensure("draft"))


# One engine with speculative decoding (STANDALONE, the draft model): started by the
# folder's first speculative test, stopped with the folder like the pool.
@pytest.fixture(scope="package")
def spec_pool(ray_cluster, s3_endpoint, scripted_model, draft_model,
              tmp_path_factory) -> Iterator[SpecPool]:
    tmp = tmp_path_factory.mktemp("sglang-spec-pool")
    tree = sglang_spec_config(tmp, s3_endpoint, rows_file=str(write_prompts(tmp / "p.jsonl", 1)),
                              model_path=scripted_model, draft_path=draft_model)
    with _deployed_for_the_folder(tree, sglang_cpu.SPEC_APP):
        pool = SpecPool(model=scripted_model, draft=draft_model)
        assert pool.url
        yield pool


# The speculative pool's run of sglang_cpu.SPEC_ROWS prompts, with logprobs (top 5):
# test_speculative reads its verify counts, test_job puts it beside its own plain run of
# the same prompts (--compare) and checks its logprobs against the plain engine's.
# On local disk: the bucket is emptied after every module, and two modules read this run.
@pytest.fixture(scope="package")
def spec_run(spec_pool, s3_endpoint, tmp_path_factory):
    from tests.integration.helpers import run
    tmp = tmp_path_factory.mktemp("spec-run")
    tree = sglang_spec_config(tmp, s3_endpoint, model_path=spec_pool.model,
                              rows_file=str(write_prompts(tmp / "p.jsonl", sglang_cpu.SPEC_ROWS)),
                              draft_path=spec_pool.draft, output=str(tmp / "runs"),
                              job={"logprobs": {"top_k": 5}})
    return tree, run(tree)


@dataclass(frozen=True)
class SmallPool:
    model: str  # the scripted model's folder

    @property
    def url(self) -> str:
        return engine_urls(sglang_cpu.SMALL_POOL_APP, 1, timeout_s=120)[0]


# One engine whose KV pool (1,024 tokens) is too small for the rows it is given
# (sglang_cpu.small_pool_engine_section): the smoke's capacity and retraction trial runs
# on it, and the KV-pool differential sends it its bursts directly. One engine start for
# both (they had one each); stopped with the folder like the pool.
@pytest.fixture(scope="package")
def small_pool(ray_cluster, s3_endpoint, scripted_model, tmp_path_factory) -> Iterator[SmallPool]:
    tmp = tmp_path_factory.mktemp("sglang-small-pool")
    tree = sglang_small_pool_config(tmp, s3_endpoint, model_path=scripted_model,
                                    rows_file=str(write_prompts(tmp / "p.jsonl", 1)))
    with _deployed_for_the_folder(tree, sglang_cpu.SMALL_POOL_APP):
        pool = SmallPool(model=scripted_model)
        assert pool.url
        yield pool


@pytest.fixture
def spec_config(spec_pool, s3_endpoint, tmp_path):
    """``spec_config(rows_file, **sections)``: a run config tree on the speculative pool."""
    def make(rows_file: Path | str, **sections):
        return sglang_spec_config(tmp_path, s3_endpoint, rows_file=str(rows_file),
                                  model_path=spec_pool.model, draft_path=spec_pool.draft,
                                  **sections)
    return make


@pytest.fixture
def real_config(sglang_pool, s3_endpoint, tmp_path):
    """``real_config(rows_file, **sections)``: a run config tree on the pool."""
    def make(rows_file: Path | str, **sections):
        return sglang_config(tmp_path, s3_endpoint, rows_file=str(rows_file),
                             model_path=sglang_pool.model, **sections)
    return make
