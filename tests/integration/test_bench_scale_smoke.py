"""Smoke test of the scale benchmark (python -m bench scale, bench/resume_scale.py): a
tiny pre-filled run resumed next to a fresh run, through the S3 latency proxy, on the
shared Ray cluster and moto. It checks that every figure is there and the resume made
exactly the new rows, never a timing threshold (this machine is shared)."""

from __future__ import annotations

import pytest

from bench.resume_scale import markdown, parse_args, run_scale

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # ~70 s: warm-up, fresh, resume, analysis

HELD, NEW = 512, 64


def test_scale_bench_resumes_exactly_the_new_rows(ray_cluster, s3_endpoint, tmp_path):
    args = parse_args(["--held", str(HELD), "--new", str(NEW), "--delays", "0.03",
                       "--time-scale", "0.002", "--endpoint", s3_endpoint, "--analysis",
                       "--work-dir", str(tmp_path), "--app-name", "raygen-scale-smoke"])
    result = run_scale(args)
    text = markdown(result, "python -m bench scale ...")
    print(text)

    fresh, resume = result.measures
    assert (fresh.mode, resume.mode) == ("fresh", "resume")
    for m in (fresh, resume):
        assert (m.status, m.rows, m.held, m.delay_s) == ("succeeded", NEW, HELD, 0.03), m
        assert m.first_request_s is not None and 0 < m.first_request_s < m.wall_s
        assert m.driver_rss_mib > 0
    assert resume.state_read_s is not None and resume.state_read_s > 0
    # the resume opened from the prefill's compact index object, and its end wrote one
    assert resume.index == "after" and resume.report_s > 0 and resume.compact_s > 0
    assert result.sidecar["rows"] == NEW and result.sidecar["format_4"] > 0
    assert set(result.analysis) == {"status", "report", "finalize"}
    assert result.analysis_rows == HELD + NEW
    assert f"| {HELD} | 30 ms | resume | {NEW} |" in text
