"""The warm start (jobs/pipeline/warmup.py) on the shared Ray cluster: the held workers
return once released, with the pipeline's modules imported; Ray Data's coordinator is
there; the go key does not outlive the session."""

from __future__ import annotations

import pytest
import ray
from ray.experimental import internal_kv

from jobs.pipeline import warmup

pytestmark = pytest.mark.integration


def test_held_workers_return_on_release_and_the_key_goes(ray_cluster):
    warm = warmup.Warmup(2, 0.1).start()
    assert not internal_kv._internal_kv_exists(warm.key, namespace=warmup.NAMESPACE)
    warm.release()
    pids = ray.get(warm.refs, timeout=120)  # each held task ended: its worker is idle now
    assert len(pids) == 2 and all(isinstance(p, int) for p in pids)
    # Ray Data's autoscaling coordinator runs (the dataset's budget comes from it).
    assert ray.get_actor("AutoscalingCoordinator", namespace="AutoscalingCoordinator")
    warm.close()
    assert not internal_kv._internal_kv_exists(warm.key, namespace=warmup.NAMESPACE)


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("RAYGEN_WARM_START", "0")
    assert warmup.start(2, 0.1) is None
