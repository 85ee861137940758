"""`python -m bench --engine`: the same benchmark on the simulator or on SGLang's real
CPU engine; the config each builds is a valid run config of that engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import run as bench_run
from jobs.config import parse_config


def test_simulator_is_the_default_engine(tmp_path):
    opt = bench_run.parse_args(["--prompts", "10"])
    cfg = parse_config(bench_run.config_tree(opt, tmp_path / "p.jsonl", 64))
    assert (cfg.engine.kind, cfg.job.max_new_tokens) == ("simulator", 4096)


def test_sglang_cpu_engine_runs_the_sampled_model_with_plain_sampling(tmp_path, monkeypatch):
    from serve_apps.engines.sglang_cpu import models
    monkeypatch.setattr(models, "ensure", lambda kind: Path("/cache") / kind)  # no build here
    opt = bench_run.parse_args(["--engine", "sglang-cpu", "--max-running", "16"])
    cfg = parse_config(bench_run.config_tree(opt, tmp_path / "p.jsonl", 32))
    assert (cfg.engine.kind, cfg.engine.device, cfg.engine.model_path) == \
        ("sglang", "cpu", "/cache/sampled")
    assert cfg.engine.max_running_requests == 16 and cfg.job.max_new_tokens == 256
    assert (cfg.job.sampling.temperature, cfg.job.sampling.top_p, cfg.job.sampling.top_k) == \
        (1.0, 1.0, -1)


def test_unknown_engine_is_refused():
    with pytest.raises(SystemExit):
        bench_run.parse_args(["--engine", "vllm"])


def test_a_kv_pool_is_set_on_either_engine_and_the_sweep_parsed(tmp_path, monkeypatch):
    from serve_apps.engines.sglang_cpu import models
    monkeypatch.setattr(models, "ensure", lambda kind: Path("/cache") / kind)
    opt = bench_run.parse_args(["--max-total-tokens", "20000", "--sweep", "8, 16,32",
                                "--modes", "plain_sweep,raygen_fixed,raygen_adaptive"])
    assert opt.sweep == (8, 16, 32)
    assert parse_config(bench_run.config_tree(opt, tmp_path / "p.jsonl", 64)
                        ).engine.simulator.max_total_tokens == 20000
    assert parse_config(bench_run.config_tree(bench_run.Options(), tmp_path / "p.jsonl", 64)
                        ).engine.simulator.max_total_tokens is None
    opt = bench_run.parse_args(["--engine", "sglang-cpu", "--max-total-tokens", "3000"])
    assert parse_config(bench_run.config_tree(opt, tmp_path / "p.jsonl", 32)
                        ).engine.max_total_tokens == 3000


def _figs(mode, tok_s, retractions, rows=1000, inflight="8"):
    from bench.report import Figures
    return Figures(mode=mode, rows=rows, expected_rows=rows, errors=0, wall_s=1.0, tok_s=tok_s,
                   ratio_plain=None, steady_tok_s=None, capacity_tok_s=None, saturation=None,
                   window=(0, 0), tail_s=0, last_row_s=0, return_s=0, ramp_s=None,
                   first_request_s=None, batch=None, longest_s=0, tail_ratio=None,
                   cpu_ms_row=0, cpu_by_role={}, cpu_by_component={}, peak_rss_mib=0,
                   rss_by_role={}, notes=[], retractions=retractions, inflight=inflight)


def test_the_anchor_is_the_best_plain_point_that_does_not_retract_and_targets_are_judged():
    from bench.report import kv_table
    text = kv_table([_figs("raygen_adaptive", 10, 900, inflight="adaptive, at most 64"),  # warm-up
                     _figs("plain@8", 900, 2), _figs("plain@16", 1000, 5),
                     _figs("plain@32", 1500, 400), _figs("raygen_fixed", 700, 300, inflight="64"),
                     _figs("raygen_adaptive", 980, 4, inflight="adaptive, at most 64")])
    assert "| plain@16 (anchor) |" in text and text.count("(anchor)") == 1
    assert "adaptive / anchor 0.980 (target >= 0.97: met)" in text
    assert "adaptive retractions 0.40% of rows (target <= 1%: met)" in text
    assert "adaptive / raygen fixed 1.400 with fixed retracting 30.00% of rows" in text
    missed = kv_table([_figs("plain@8", 1000, 50), _figs("raygen", 900, 20,
                                                         inflight="adaptive, at most 8")])
    assert "0.900 (target >= 0.97: MISSED; no plain point retracted <= 1%" in missed
    assert "2.00% of rows (target <= 1%: MISSED)" in missed


def test_a_rate_survives_one_unanswered_scrape_but_not_a_counter_reset_or_many_failures():
    from bench.engines import EngineWatch
    watch = EngineWatch(["http://127.0.0.1:1"])
    watch.tokens = [float(t) for t in range(0, 2000, 100)]   # 20 scrapes, rising
    assert watch.trustworthy()
    watch.failed_scrapes = 1        # one scrape unanswered in 5 s (a loaded machine)
    assert watch.trustworthy()
    watch.failed_scrapes = 3        # 3 of 23: more than one in ten
    assert not watch.trustworthy()
    watch.failed_scrapes = 0
    watch.tokens[10] = 50.0         # an engine replaced: its counter starts from 0 again
    assert not watch.trustworthy()


def test_the_engines_are_scraped_side_by_side():
    """One sample asks every engine at once: serially, at 32 replicas on 2 cores, one slow
    engine held up the rest until the sample timed out. Four URLs of one slow server:
    all four requests are in it together, and the sample sums their counters."""
    import http.server
    import threading
    import time

    from bench.engines import EngineWatch
    state = {"now": 0, "most": 0}
    lock = threading.Lock()

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            with lock:
                state["now"] += 1
                state["most"] = max(state["most"], state["now"])
            time.sleep(0.3)
            with lock:
                state["now"] -= 1
            body = b"sglang:generation_tokens_total 5\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        watch = EngineWatch([f"http://127.0.0.1:{server.server_port}"] * 4)
        watch.sample()
        watch.stop()  # its closing sample, then the scrapers go
    finally:
        server.shutdown()
    assert state["most"] == 4
    assert watch.tokens == [20.0, 20.0]
