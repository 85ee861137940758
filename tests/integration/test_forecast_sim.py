"""The what-if forecast against the simulator, whose lengths are known: forecast the
truncated fraction at 8192 from a 4096 run, then continue the same prompts to 8192 and
check the realised fraction lies within the forecast's stated range. Also the pilot."""

from __future__ import annotations

import pytest

from jobs.analysis.forecast import forecast
from jobs.runs.pilot import pilot_config
from jobs.config import parse_config
from tests.integration.helpers import run_config, write_prompts
from tests.integration.helpers import read, run

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _latest(df):
    return df.sort_values("version").groupby("key").tail(1)


def test_forecast_brackets_what_the_simulator_then_produces(ray_cluster, s3_endpoint,
                                                            tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", 800)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows))
    run(tree)
    at_4096 = read(tree, "data")
    (row,) = forecast(at_4096, [8192])
    assert row["extrapolated"] and row["truncated_lo"] <= row["truncated_fraction"] <= row["truncated_hi"]

    run(tree, continue_truncated=True, max_total_tokens=8192)
    realised = (_latest(read(tree, "data")).finish_reason == "length").mean()
    print(f"forecast at 8192: {row['truncated_fraction']:.4f} "
          f"[{row['truncated_lo']:.4f}, {row['truncated_hi']:.4f}], realised {realised:.4f}")
    # The range is for the population fraction; a finite sample adds binomial noise.
    noise = 2 * (realised * (1 - realised) / len(at_4096)) ** 0.5
    assert row["truncated_lo"] - noise <= realised <= row["truncated_hi"] + noise
    truncated_before = (at_4096.finish_reason == "length").mean()
    assert 0.12 < truncated_before < 0.25 and realised < truncated_before / 3


def test_pilot_samples_every_category(ray_cluster, s3_endpoint, tmp_path):
    rows = write_prompts(tmp_path / "p.jsonl", 200)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows),
                      job={"max_new_tokens": 12000})
    cfg = pilot_config(parse_config(tree), 40)
    assert cfg.job.run_name.endswith("-pilot")
    pilot_tree = dict(tree, job=dict(tree["job"], input=cfg.job.input[0],
                                     run_name=cfg.job.run_name))
    summary = run(pilot_tree)
    data = read(pilot_tree, "data")
    assert 40 <= len(data) <= 60 and summary.status == "succeeded"
    assert set(data.category) == {"coding", "reasoning", "multi_turn", "tool_calling"}
    assert (data.finish_reason == "length").mean() < 0.05  # a high cap censors few rows
