"""Smoke test of the benchmark (bench/): one small run of every mode on the shared
local Ray cluster, raygen writing to the moto S3. It checks that every figure is
present and sane, never a timing threshold (this machine is shared)."""

from __future__ import annotations

import math

import pytest

from bench.report import COLUMNS
from bench.run import Options, run_bench
from tests.integration.helpers import BUCKET

pytestmark = pytest.mark.integration

PROMPTS = 300


def test_bench_produces_complete_sane_figures(ray_cluster, s3_endpoint, tmp_path):
    opt = Options(prompts=PROMPTS, replicas=2, time_scale=0.02, inflight=128, actors=1,
                  work_dir=str(tmp_path), output=f"s3://{BUCKET}/bench-smoke",
                  app_name="raygen-bench-smoke", out=str(tmp_path / "bench.md"))
    result = run_bench(opt, ["--prompts", str(PROMPTS), "--replicas", "2"])
    print(result.markdown)

    assert [f.mode for f in result.figures] == ["raygen", "plain", "raydata_llm"]
    assert len(result.engine_urls) == 2 and result.capacity_tok_s > 0
    for f in result.figures:
        assert (f.rows, f.expected_rows, f.errors) == (PROMPTS, PROMPTS, 0), f
        assert f.tok_s > 0 and f.wall_s > 0
        assert f.saturation is not None and 0 < f.saturation <= 1.05, f
        assert f.steady_tok_s is not None and f.steady_tok_s > 0
        # Tail: S3 (moto) file times have 1 s resolution, so only roughly >= 0 here.
        assert f.longest_s > 0 and f.tail_s > -1.5 and f.tail_ratio is not None
        assert f.cpu_ms_row > 0 and all(math.isfinite(v) for v in f.cpu_by_role.values())
        assert f.peak_rss_mib > 0
        assert len(f.row()) == len(COLUMNS) and "n/a" not in f.row()[3:]
    by_mode = {f.mode: f for f in result.figures}
    assert by_mode["plain"].ratio_plain == pytest.approx(1.0)
    # raygen's CPU covers the driver, the Ray Data workers, the replicas and Ray itself.
    assert {"driver", "ray_workers", "serve", "ray_system"} <= by_mode["raygen"].cpu_by_role.keys()
    assert by_mode["raygen"].cpu_by_role["serve"] > 0
    # The start-up figures: the first request, and raygen's idle GPU-s from its engines.
    assert all(f.first_request_s is not None for f in result.figures)
    idle = by_mode["raygen"].idle_gpu_s
    assert idle is not None and idle["engines"] >= 2 and idle["total"] >= 0
    text = (tmp_path / "bench.md").read_text()
    assert all(c in text for c in COLUMNS) and "| raydata_llm |" in text
