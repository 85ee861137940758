"""GPU-hours arithmetic (jobs/analysis/gpu_hours.py): what a session held, what the run
spent across sessions, the forecast for the rows left at the measured rate, the cost."""

from __future__ import annotations

import pytest

from jobs.analysis import gpu_hours
from jobs.analysis.gpu_hours import Carried, figures


def test_a_session_alone_at_one_gpu_per_engine():
    # 2 engines x 1 GPU for 30 min = 3,600 GPU-s x 2 / 2 ... 1.0 GPU-h held; 2M tokens.
    g = figures(3600.0, Carried(), 2_000_000, rows_left=500, mean_tokens=2000.0,
                gpus_per_engine=1, engines=2, price=3.5)
    assert (g["unit"], g["session"], g["earlier_sessions"], g["spent"]) == ("GPU-h", 1.0, 0.0, 1.0)
    assert g["output_tok_per_gpu_h"] == g["session_output_tok_per_gpu_h"] == 2_000_000
    # 500 rows x 2,000 tokens = 1M tokens at 2M/GPU-h: half a GPU-hour, 1.75 at 3.50
    assert g["forecast_rows_left"] == 0.5
    assert (g["cost_spent"], g["cost_forecast_rows_left"]) == (3.5, 1.75)
    assert g["sessions"] == 1 and g["measured"]


def test_a_resumed_run_adds_its_sessions_up():
    first = figures(7200.0, Carried(), 1_000_000, 100, 1000.0, 1, 2)
    carried = Carried.of({"gpu_hours": first})
    assert carried == Carried(2.0, 1_000_000, 1, "GPU-h")
    second = figures(1800.0, carried, 250_000, 0, 1000.0, 1, 2)
    assert (second["earlier_sessions"], second["session"], second["spent"]) == (2.0, 0.5, 2.5)
    assert second["sessions"] == 2 and second["output_tokens"] == 1_250_000
    assert second["output_tok_per_gpu_h"] == 500_000  # the run's: 1.25M / 2.5 GPU-h
    third = figures(0.0, Carried.of({"gpu_hours": second}), 0, 0, 1000.0, 1, 2)
    assert third["spent"] == 2.5 and third["sessions"] == 3


def test_zero_elapsed_and_nothing_gained_have_no_rate_and_no_forecast():
    g = figures(0.0, Carried(), 0, rows_left=10, mean_tokens=500.0, gpus_per_engine=1, engines=2)
    assert (g["session"], g["spent"]) == (0.0, 0.0)
    assert g["session_output_tok_per_gpu_h"] is None and g["output_tok_per_gpu_h"] is None
    assert g["forecast_rows_left"] is None  # not 0: nothing measured yet


def test_a_session_that_only_attached_so_far_forecasts_at_the_runs_rate():
    carried = Carried(2.0, 4_000_000, 1, "GPU-h")
    g = figures(30.0, carried, 0, rows_left=1000, mean_tokens=1000.0, gpus_per_engine=1)
    assert g["session_output_tok_per_gpu_h"] is None
    # the run's rate: 4M tokens over 2 GPU-h + 30 GPU-s
    assert g["output_tok_per_gpu_h"] == pytest.approx(4_000_000 / (2 + 30 / 3600), rel=1e-6)
    assert g["forecast_rows_left"] == pytest.approx(1e6 / g["output_tok_per_gpu_h"], rel=1e-3)


def test_zero_rows_left_cost_nothing_and_no_row_done_yet_is_not_forecast():
    g = figures(3600.0, Carried(), 1_000_000, rows_left=0, mean_tokens=2000.0, price=2.0)
    assert g["forecast_rows_left"] == 0.0 and g["cost_forecast_rows_left"] == 0.0
    g = figures(3600.0, Carried(), 0, rows_left=50, mean_tokens=0.0)
    assert g["forecast_rows_left"] is None and g["cost_forecast_rows_left"] is None


def test_engines_without_a_gpu_count_as_engine_hours_never_zero():
    g = figures(7200.0, Carried(), 100, 0, 10.0, gpus_per_engine=0, engines=2)
    assert g["unit"] == "engine-h" and g["session"] == 2.0
    assert gpu_hours.engine_weight(0) == gpu_hours.engine_weight(None) == 1.0
    assert gpu_hours.engine_weight(2) == 2.0
    # a refused plan's session has no engines: the unit goes on from the run's
    assert figures(0.0, Carried(1.0, 5, 1, "GPU-h"), 0, 0, 0.0)["unit"] == "GPU-h"


def test_an_unmeasured_session_adds_nothing_and_says_so():
    g = figures(None, Carried(1.0, 100, 1, "GPU-h"), 50, 0, 10.0, 1, None)
    assert not g["measured"] and g["session"] == 0.0 and g["spent"] == 1.0
    assert "no engine reported its clock" in gpu_hours.describe(g, 0)[0]


@pytest.mark.parametrize("old", [None, {}, {"gpu_hours": None}, {"gpu_hours": "x"},
                                 {"gpu_hours": {"spent": "NaN", "output_tokens": -3}}])
def test_an_old_or_odd_progress_json_carries_nothing(old):
    assert Carried.of(old) == Carried()


def test_the_summary_lines():
    g = figures(5400.0, Carried(0.5, 0, 1, "GPU-h"), 3_000_000, 2_112, 1500.0, 1, 2, 3.5)
    line, cost = gpu_hours.describe(g, 2_112)
    assert line == ("  GPU-hours: 1.5 GPU-h this session (2 engines x 1 GPU), 2 for the run "
                    "(0.5 in earlier sessions); ~1.58 GPU-h for the 2,112 rows left at 2M "
                    "output tok/GPU-h")
    assert cost == "  cost:      7.00 spent at 3.50 per GPU-h, ~5.54 for the rows left"
    sim = figures(36.0, Carried(), 10_000, 0, 100.0, 0, 2)
    assert gpu_hours.describe(sim, 0) == [
        "  engine-h:  0.01 engine-h this session (2 engines, no GPU each: engine-hours), "
        "0.01 for the run"]
    assert gpu_hours.describe(None) == []
