"""progress.json's gpu_hours across sessions (jobs/runs/progress.py): each session goes on
from what the previous progress.json says the run spent, whatever its status; one
written before the count carries nothing and still reads; `raygen status` shows it."""

from __future__ import annotations

import time

from jobs.analysis import status
from jobs.config import StorageConfig
from jobs.io.run_store import RunStore
from jobs.io.storage import write_json_atomic
from jobs.runs.progress import ProgressTracker
from tests.support.run_rows import make_row, write_rows


def session(store: RunStore, held_gpu_s: float, total: int = 10, price=None) -> dict:
    """One session whose two 1-GPU replicas held held_gpu_s so far."""
    tracker = ProgressTracker(store, total, "r", "m", 60,
                              gpu_held=lambda: {"gpu_s": held_gpu_s, "engines": 2},
                              gpus_per_engine=1, price_per_gpu_hour=price)
    tracker.start()
    return tracker


def test_sessions_add_up_and_the_rows_left_are_forecast(tmp_path):
    store = RunStore(str(tmp_path / "run"), StorageConfig())
    first = session(store, 0.0, price=2.0)
    write_rows(store, "data", [make_row(f"p{i}", completion_tokens=1000) for i in range(4)])
    # held 2 GPU-h while the run gained 4,000 tokens: 2,000 tok/GPU-h
    first.gpu_held = lambda: {"gpu_s": 7200.0, "engines": 2}
    g1 = first.stop("stopped")["gpu_hours"]
    assert (g1["session"], g1["spent"], g1["sessions"]) == (2.0, 2.0, 1)
    assert g1["session_output_tok_per_gpu_h"] == 2000
    # 6 rows left x 1,000 tokens each / 2,000 per GPU-h
    assert g1["forecast_rows_left"] == 3.0 and g1["cost_forecast_rows_left"] == 6.0

    second = session(store, 0.0, price=2.0)  # a resume: reads what the first one spent
    assert second.last["gpu_hours"]["earlier_sessions"] == 2.0
    write_rows(store, "data", [make_row(f"q{i}", completion_tokens=1000) for i in range(6)])
    second.gpu_held = lambda: {"gpu_s": 1800.0, "engines": 2}
    g2 = second.stop("succeeded")["gpu_hours"]
    assert (g2["earlier_sessions"], g2["session"], g2["spent"], g2["sessions"]) == (2.0, 0.5, 2.5, 2)
    assert g2["output_tokens"] == 10_000 and g2["output_tok_per_gpu_h"] == 4000
    assert g2["forecast_rows_left"] == 0.0 and g2["cost_spent"] == 5.0

    # A session that held nothing yet (just attached) still carries the run's total.
    third = session(store, 0.0)
    assert third.last["gpu_hours"]["spent"] == 2.5
    third.stop("succeeded")
    assert store.read_json("progress.json")["gpu_hours"]["sessions"] == 3


def test_a_progress_json_from_before_gpu_hours_reads_and_carries_nothing(tmp_path, capsys):
    store = RunStore(str(tmp_path / "run"), StorageConfig())
    old = {"run": "r", "model": "m", "status": "stopped", "total": 10, "completed": 4,
           "remaining": 6, "updated_at": time.time()}
    write_json_atomic(store.loc("progress.json"), old)
    assert status.main([store.root.path]) == 0  # an old file still reads
    assert "gpu-hours  ? (not in this progress.json)" in capsys.readouterr().out
    g = session(store, 900.0).stop("succeeded")["gpu_hours"]
    assert (g["earlier_sessions"], g["spent"]) == (0.0, 0.25)


def test_status_shows_spent_forecast_and_cost():
    g = {"unit": "GPU-h", "spent": 12.5, "session": 2.25, "forecast_rows_left": 40.2,
         "session_output_tok_per_gpu_h": 1.9e6, "price_per_gpu_h": 3.0,
         "cost_spent": 37.5, "cost_forecast_rows_left": 120.6}
    text = status.render({"gpu_hours": g, "remaining": 5000, "updated_at": time.time()})
    assert ("gpu-hours  12.5 GPU-h spent (2.25 this session); rows left ~40.2 GPU-h at "
            "1.9M output tok/GPU-h; cost 37.50 spent, ~120.60 left") in text
    done = status.render({"gpu_hours": dict(g, price_per_gpu_h=None), "remaining": 0})
    assert "gpu-hours  12.5 GPU-h spent (2.25 this session)\n" in done + "\n"
