"""jobs.analysis.status and jobs.analysis.run_cli: the readable progress block and opening a run."""

from __future__ import annotations

import time

import pytest

from jobs.analysis import status
from jobs.analysis.run_cli import open_run, storage_settings
from jobs.io.storage import write_json_atomic

SNAP = {"run": "demo", "model": "qwen", "status": "running", "total": 10000,
        "completed": 2500, "failed": 3, "rejected": 2, "truncated": 450,
        "truncated_fraction": 0.18, "remaining": 7495, "rate_rows_per_s": 2.5,
        "rate_output_tok_per_s": 6000.0, "eta_s": 2998, "mean_output_tokens": 2417.0,
        "output_tokens": 6042500, "bytes_written": 5 * 2 ** 20, "files": 40,
        "started_at": 0, "elapsed_s": 3725.0, "last_write_at": None}


def test_render_fresh_running_run():
    now = time.time()
    text = status.render({**SNAP, "updated_at": now - 5}, now)
    assert "2,500 / 10,000 done (25.0%)" in text
    assert "18.0%" in text and "6,000 output tok/s" in text
    assert "0:50 (h:mm)" in text          # ETA 2998 s
    assert "1:02 (h:mm)" in text          # elapsed 3725 s
    assert "stale" not in text


def test_stale_running_run_gets_the_hint(store, capsys):
    write_json_atomic(store.loc("progress.json"), {**SNAP, "updated_at": time.time() - 600})
    assert status.main([store.root.path]) == 0
    out = capsys.readouterr().out
    assert "(stale: last update 10 min ago — driver probably killed; rerun the same " \
           "command to resume)" in out


def test_finished_run_is_never_stale():
    snap = {**SNAP, "status": "succeeded", "updated_at": time.time() - 86400, "eta_s": None}
    text = status.render(snap)
    assert "stale" not in text and "eta        ? (h:mm)" in text


def test_missing_progress_exits_1(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        status.main([str(tmp_path / "nope")])
    assert exc.value.code == 1
    assert "no progress.json" in capsys.readouterr().err


def test_storage_from_config_or_env(tmp_path, monkeypatch):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("job: {input: x, output: y, run_name: z}\n"
                   "storage: {endpoint_url: 'http://127.0.0.1:9', region: eu-west-1}\n")
    s = storage_settings(str(cfg))
    assert (s.endpoint_url, s.region) == ("http://127.0.0.1:9", "eu-west-1")
    monkeypatch.setenv("RAYGEN_S3_ENDPOINT", "http://127.0.0.1:7")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    s = storage_settings(None)
    assert (s.endpoint_url, s.region) == ("http://127.0.0.1:7", "ap-south-1")
    assert open_run(str(tmp_path / "r")).root.path == str(tmp_path / "r")


def test_bad_config_and_uri_exit_1(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("storage: {bucket: nope}\n")
    with pytest.raises(SystemExit):
        storage_settings(str(cfg))
    assert "storage.bucket" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        open_run("gs://bucket/run")
    assert "unsupported URI scheme" in capsys.readouterr().err
