"""Observability checked against a REAL Prometheus scraping the test's Ray cluster.

A private Prometheus (module fixture) scrapes this session's Ray cluster through Ray's
file-SD list and evaluates ``dashboards/prometheus/raygen_rules.yml`` every second.
Three runs (run labels ``mlive-<id>-<role>``) produce every signal the dashboard and
the alerts use:

* ``faults``: 2 malformed lines + 60 prompts while the engines answer half the
  requests with 503 and the job allows 2 attempts -> retries, permanent failures,
  rejects (in their own run, so retried generations cannot skew the counted run).
* ``crash``: a Ray driver running raygen's ProgressTracker + JobGauges, SIGKILLed once
  Prometheus has seen it running -> its gauges vanish with rows left, which is
  exactly what RaygenJobDriverGone looks for.
* ``counted``: 150 prompts + 2 malformed lines, no errors, max_new_tokens 4096 (some
  truncation). Its counters must agree exactly with its Parquet output.

Then:

1. every dashboard panel target (taken from the generator) returns a series;
2. every rule in the rules file evaluates without error, and each alert's signal (its
   query before the threshold comparison, as ``alerts.Alert`` exposes it) and each
   recording rule return data, in the Prometheus form and Grafana's inlined form;
3. output/prompt tokens, completions by finish_reason (so the truncated fraction),
   speculative counters, histogram counts and the job gauges match the Parquet output
   exactly, and so do the job-side counters (failures, retries, rejects), which the
   driver counts from durable rows;
4. every catalogued metric is exported and nothing uncatalogued is.

The engines run SLOW_FACTOR x slower (no errors) so each run spans several of Ray's
10 s metric reports: rate()/increase() only see growth between two reports of a
series, so a run that fits into one report leaves rate-based signals without data.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import pytest
import yaml

from dashboards import alerts, build
from dashboards import metrics_catalog as mc
from dashboards import promql as q
from tests.integration.helpers import run_config, write_prompts
from tests.integration.helpers import CLEAR_FAULTS, engine_urls, read, run, set_faults, write_yaml
from tests.support import ray_dashboards as rd
from tests.support.prometheus import (INTERVAL_S, Prom, PromError, panel_targets, running_prometheus,
                                      session_dir, substitute, wait_for)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
# Its own app: one of its engines breaks its outputs on purpose, and the drain that would
# replace that engine (serve_apps/output_watch.py, tested in test_integrity.py) is off here
# so the counted run's counters stay exact.
APP = "raygen-metrics-live"
ENGINE = {"drain_flagged_fraction": None}
MODEL = "sim-test"  # run_config's engine.model_path (model_name defaults to it)
BAD_LINES = ['{"id": "broken", "messages": [', '{"id": "nomsg"}']
FINAL_WAIT_S = 60  # bound for "the final values are scraped" (Ray reports every ~10 s)
CATEGORY_LIMIT = 2  # the counted run's metrics_category_limit (its prompts have 4 categories)
COUNTED_TRUNCATION_RATIO = 0.3  # the counted run's truncation_alert_ratio, exported as a gauge
SLOW_FACTOR = 80.0  # engine slowdown: a median completion takes ~3.6 s instead of ~45 ms
# The counted run carries the rate-and-running signals (RaygenThroughputDrop): it must
# span several 10 s scrapes (the repo config's) while its driver reports running, even
# when a loaded node's metrics page takes most of the scrape timeout to render.
COUNTED_SLOW_FACTOR = 2 * SLOW_FACTOR


# Alerts whose signal exists only past a volume this test's runs do not reach: the
# per-replica flagged rate needs 50 rows of one replica within one run in 15m (the fault
# run has ~45 rows in all). Their inputs (recording rules) must still have data here and
# every expression must evaluate; promtool's cases (dashboards/prometheus/
# raygen_rules_test.yml) fire and silence them on series of that volume.
VOLUME_GATED = {"RaygenReplicaOutputsFlagged"}


@pytest.fixture(scope="module")
def prometheus(ray_cluster, tmp_path_factory):
    with running_prometheus(tmp_path_factory.mktemp("prometheus")) as prom:
        yield prom


# --- the runs ------------------------------------------------------------------------

@dataclass
class Live:
    prom: Prom
    runs: dict[str, str]  # role -> run name
    t0: float  # before the first run
    t_eval: float = 0.0  # instant queries: when the counted run's final values are in
    t_end: float = 0.0  # end of the range for alert signals (after the driver-gone alert)
    window: str = ""  # covers everything since Prometheus started: stands in for $__rate_interval
    counted: dict[str, pd.DataFrame] = field(default_factory=dict)
    faults: dict[str, pd.DataFrame] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)  # seconds since t0, for the log

    def sel(self, metric: str, role: str, *matchers: str) -> str:
        return q.sel(metric, f'run="{self.runs[role]}"', *matchers)


def _tree(tmp: Path, s3_endpoint: str, name: str, n: int, extra_lines=(), **job: Any) -> dict:
    rows = write_prompts(tmp / f"{name}.jsonl", n, extra_lines=list(extra_lines))
    return run_config(tmp, s3_endpoint, rows_file=str(rows), run_name=name, app_name=APP,
                      engine=ENGINE, job=job)


# A job driver reduced to what feeds the job gauges: the same ProgressTracker +
# JobGauges that jobs.runs.run.Session starts before the pipeline, in a real Ray driver
# process on this cluster (RAY_ADDRESS is set by the ray_cluster fixture). The full
# pipeline adds nothing to what the alert sees and would cost a whole Ray Data job.
_CRASH_DRIVER = """
import sys, time, ray
from jobs.config import load_config
from jobs.runs.job_metrics import JobGauges
from jobs.runs.progress import ProgressTracker
from jobs.io.run_store import RunStore
from jobs.io.sources import count_rows
from jobs.io.storage import locate
cfg = load_config(sys.argv[1], [])
ray.init()
store = RunStore.for_run(cfg.job.output, cfg.job.run_name, cfg.storage)
total = sum(count_rows(locate(uri, cfg.storage)) for uri in cfg.job.input)
ProgressTracker(store, total, cfg.job.run_name, cfg.engine.model_name, cfg.job.progress_interval_s,
                JobGauges.for_config(cfg)).start()
time.sleep(600)
"""


def _start_crash_driver(tree: dict, tmp: Path) -> subprocess.Popen:
    cfg = write_yaml(tmp / "crash.yaml", tree)
    with open(tmp / "crash-driver.log", "wb") as log:
        return subprocess.Popen([sys.executable, "-c", _CRASH_DRIVER, str(cfg)], cwd=REPO,
                                stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))


def _write_faults_prompts(path: Path, n: int) -> Path:
    """Malformed lines FIRST: their rejects are counted early in the run (see
    test_job_side_counters_match_the_output for why the end of a run is not safe)."""
    write_prompts(path, n)
    path.write_text("".join(line + "\n" for line in BAD_LINES) + path.read_text())
    return path


@pytest.fixture(scope="module")
def live(ray_cluster, s3_endpoint, prometheus, tmp_path_factory) -> Live:
    from jobs.config import parse_config
    from serve_apps.app import deploy_or_attach

    tmp = tmp_path_factory.mktemp("metrics-live")
    prefix = f"mlive-{uuid.uuid4().hex[:6]}"
    runs = {role: f"{prefix}-{role}" for role in ("faults", "crash", "counted")}
    t0 = time.time()
    lv = Live(prometheus, runs, t0)
    prom = prometheus
    faults_rows = _write_faults_prompts(tmp / "faults.jsonl", 60)
    # 16 rows in flight: the fault run's rows are spread over several Ray report
    # intervals, so its failures/retries/rejects are exported while its actor lives.
    faults_tree = run_config(tmp, s3_endpoint, rows_file=str(faults_rows), run_name=runs["faults"],
                             app_name=APP, engine=ENGINE, job={"retries": {"max_attempts": 2},
                                                "inflight_rows_per_actor": 16})
    crash_tree = _tree(tmp, s3_endpoint, runs["crash"], 100)
    counted_tree = _tree(tmp, s3_endpoint, runs["counted"], 150, BAD_LINES,
                         truncation_alert_ratio=COUNTED_TRUNCATION_RATIO, metrics_category_limit=CATEGORY_LIMIT)

    crash = _start_crash_driver(crash_tree, tmp)
    try:
        # Bring the app up (or attach to it) so the engines exist for /sim/faults.
        cfg = parse_config(faults_tree)
        deploy_or_attach(cfg.engine, cfg.serve)
        urls = engine_urls(APP, 2)
        # Retries and permanent failures: half the requests get a 503, 2 attempts per row
        # -> ~25% of rows fail (the breaker allows 50%). Slow decoding spreads the run.
        # One engine also breaks its outputs (token-id loops reported as success): the
        # integrity counters, panels and the per-replica flagged alert get data.
        try:
            set_faults(urls, error_rate=0.5, error_status=503, slow_rate=1.0, slow_factor=SLOW_FACTOR)
            set_faults(urls[:1], broken_output="token_loop")
            run(faults_tree)
        finally:
            set_faults(urls, **CLEAR_FAULTS, slow_factor=5.0)
        lv.faults = {kind: read(faults_tree, kind) for kind in ("data", "failures", "rejects")}
        lv.phases["faults run"] = time.time() - t0

        # Kill the crash driver once Prometheus has seen it running (Ray reports every ~10 s).
        running = lv.sel(mc.JOB_RUNNING.prom_name, "crash")

        def crash_seen_running() -> bool:
            assert crash.poll() is None, (tmp / "crash-driver.log").read_text()[-3000:]
            return prom.value(f"max({running})") == 1
        wait_for("the crash driver's job_running=1 in Prometheus", crash_seen_running, 60)
    finally:
        if crash.poll() is None:
            crash.send_signal(signal.SIGKILL)
        crash.wait()

    # The counted run: no errors, so every request is generated exactly once. Slow
    # decoding (see the module docstring) gives the throughput signal and the truncation
    # alert's volume gate (increase >= 50 completions) growth between reports.
    try:
        set_faults(urls, slow_rate=1.0, slow_factor=COUNTED_SLOW_FACTOR)
        summary = run(counted_tree)
    finally:
        set_faults(urls, **CLEAR_FAULTS, slow_factor=5.0)
    assert summary.status == "succeeded"
    lv.phases["counted run"] = time.time() - t0
    lv.counted = {kind: read(counted_tree, kind) for kind in ("data", "failures", "rejects")}

    # Wait (bounded) until Prometheus holds the counted run's final values. The
    # driver's job gauges are dropped by Ray ~2 report intervals after their last
    # set() (the in-process driver stops setting them when the run ends), so the
    # instant queries are evaluated right then, at t_eval.
    data = lv.counted["data"]
    final = {
        "completions": (f"sum({lv.sel(mc.COMPLETIONS.prom_name, 'counted')})", len(data)),
        "output tokens": (f"sum({lv.sel(mc.OUTPUT_TOKENS.prom_name, 'counted')})",
                          int(data.completion_tokens.sum())),
        "rows_done": (f"max({lv.sel(mc.JOB_ROWS_DONE.prom_name, 'counted')})", len(data)),
        "job_running=0": (f"max({lv.sel(mc.JOB_RUNNING.prom_name, 'counted')})", 0),
    }
    wait_for(f"the counted run's final values in Prometheus {final}",
          lambda: all(prom.value(expr) == want for expr, want in final.values()), FINAL_WAIT_S,
          every_s=INTERVAL_S)
    lv.t_eval = time.time()
    lv.window = f"{math.ceil(lv.t_eval - prom.started) + 5}s"
    lv.phases["final values"] = lv.t_eval - t0
    # The killed driver's gauges are gone by now or soon: RaygenJobDriverGone goes pending.
    gone = f'ALERTS{{alertname="RaygenJobDriverGone", run="{runs["crash"]}"}}'
    wait_for("RaygenJobDriverGone for the killed driver", lambda: prom.query(gone), FINAL_WAIT_S,
          every_s=INTERVAL_S)
    # The range checks step every INTERVAL_S from t0: their last step must come after the
    # final values' sample. A counted run whose durable rows jump 0 -> 64 -> 150 with its
    # last parts (rows_done counts durable rows) can show rows_done >= 50, the truncation
    # alert's volume gate, in its final report only; with t_end a few ms after t_eval no
    # step saw it (RaygenTruncationHigh's signal had no data, every series sampled).
    time.sleep(max(0.0, lv.t_eval + 2 * INTERVAL_S - time.time()))
    lv.t_end = time.time()
    lv.phases["driver-gone alert"] = lv.t_end - t0
    print(f"\nruns {runs}; phases (s since start): { {k: round(v) for k, v in lv.phases.items()} }; "
          f"rate window {lv.window}")
    return lv


# --- 1. dashboard panels ------------------------------------------------------------

def test_generated_files_are_current():
    # The rules Prometheus loads and the dashboard JSON are what the generator produces.
    assert build.stale_files() == [], "run `python -m dashboards.build`"


def test_every_panel_target_returns_data(live):
    run_regex = "(" + "|".join(live.runs.values()) + ")"  # Grafana's multi-value format
    values = {"run": run_regex, "model": MODEL, "datasource": "unused",
              "__rate_interval": live.window, "__interval": f"{INTERVAL_S}s"}
    targets = panel_targets()
    assert len(targets) > 20
    empty, errors = [], []
    for title, expr in targets:
        try:
            if not live.prom.query(substitute(expr, values), live.t_eval):
                empty.append(title)
        except PromError as exc:
            errors.append(f"{title}: {exc}")
    assert not errors, "panel queries failed:\n" + "\n".join(errors)
    assert not empty, f"panel targets with no series: {empty}"

    # The dashboard's variables find the runs and the model.
    run_values = live.prom.api("label/run/values", **{"match[]": mc.JOB_RUNNING.prom_name})
    assert {live.runs[r] for r in ("faults", "counted")} <= set(run_values)
    models = live.prom.api("label/model/values",
                           **{"match[]": f'{mc.JOB_RUNNING.prom_name}{{run=~"{run_regex}"}}'})
    assert models == [MODEL]


# --- 2. alerts -------------------------------------------------------------------------

def _presence(live: Live, expr: str) -> str:
    """For a signal without data: in how many of the range's steps each series it reads
    had a sample, per run (a loaded run once lost RaygenTruncationHigh's signal, cause
    not seen)."""
    names = sorted(set(re.findall(r"ray_raygen_\w+|raygen:\w+", expr)))
    steps = {name: {s["metric"].get("run", "?"): len(s["values"]) for s in live.prom.query_range(
        f"count by (run) ({name})", live.t0, live.t_end)} for name in names}
    # each series' largest value per run over the range, and its last step with a sample
    # (s after t0)
    peaks = {name: {s["metric"].get("run", "?"): (max(float(v) for _, v in s["values"]),
                                                  round(float(s["values"][-1][0]) - live.t0))
                    for s in live.prom.query_range(f"max by (run) ({name})", live.t0, live.t_end)}
             for name in names}
    return (f"steps with samples per run, of {live.t_end - live.t0:.0f} s: {steps}; "
            f"(peak, last step) per run: {peaks}")


def test_every_rule_evaluates_and_every_alert_signal_has_data(live):
    prom = live.prom
    rules_file = yaml.safe_load(build.RULES_YML.read_text())
    (group,) = rules_file["groups"]
    file_alerts = {r["alert"]: r["expr"] for r in group["rules"] if "alert" in r}
    file_records = {r["record"]: r["expr"] for r in group["rules"] if "record" in r}
    assert file_alerts == {a.name: a.expr for a in alerts.ALERTS}
    assert file_records == alerts.RECORDING_RULES

    # Prometheus evaluated every rule of the file without error.
    (loaded,) = [g for g in prom.api("rules")["groups"] if g["name"] == alerts.GROUP]
    assert len(loaded["rules"]) == len(group["rules"])
    bad = [(r["name"], r.get("lastError")) for r in loaded["rules"] if r["health"] != "ok"]
    assert not bad, bad

    problems = []
    for name in alerts.RECORDING_RULES:
        if not prom.query_range(name, live.t0, live.t_end):
            problems.append(f"recording rule {name}: no data")
    for a in alerts.ALERTS:
        # Each expression is evaluated directly too (an error raises PromError).
        prom.query(a.expr, live.t_end)
        prom.query(alerts.inline_recording_rules(a.expr), live.t_end)
        # The signal is the query before the threshold comparison (Alert.expr is
        # compare(query, op, threshold)); some are only defined while a job runs
        # (they are `and`-gated on job_running == 1), so look over the whole test.
        assert a.expr == q.compare(a.query, a.op, a.threshold)
        if a.name in VOLUME_GATED:
            continue
        for form, expr in (("rules", a.query), ("grafana", alerts.inline_recording_rules(a.query))):
            if not prom.query_range(expr, live.t0, live.t_end):
                problems.append(f"{a.name} ({form} form): signal has no data: {expr}; "
                                f"{_presence(live, expr)}")
    assert not problems, "\n".join(problems)

    # The killed driver shows up as an alert on its way to firing (pending: `for` is 2m).
    active = prom.query("ALERTS", live.t_end)
    seen = {(s["metric"]["alertname"], s["metric"].get("run")) for s in active}
    assert ("RaygenJobDriverGone", live.runs["crash"]) in seen, seen


# --- 3. counters vs the Parquet output ----------------------------------------------------

def _total(live: Live, metric: mc.Metric, role: str) -> float:
    """The counter's increase over the test for one run (0 when it has no series).

    The run label is new, so the counter was 0 before the test: the increase is its
    value now. Not PromQL's increase(): Ray creates a series at its first report, with
    everything counted so far, and increase()/rate() only see growth *between*
    samples, so for a series born mid-window they miss the first report.
    """
    prom, at, s = live.prom, live.t_eval, live.sel(metric.prom_name, role)
    assert prom.value(f"sum(resets({s}[{live.window}]))", at) in (0, None), f"counter reset in {s}"
    assert prom.value(f"sum({s} offset {math.ceil(at - live.t0)}s)", at) is None, f"{s} predates the test"
    return prom.value(f"sum({s})", at) or 0.0


def _job_side_expected(live: Live) -> dict[tuple[str, str], int]:
    """(metric, run role) -> what the Parquet output says the job-side counter must be."""
    fdata, ffail, frej = (live.faults[k] for k in ("data", "failures", "rejects"))
    return {
        (mc.FAILURES.name, "faults"): len(ffail),
        (mc.RETRIES.name, "faults"): int((fdata.attempts - 1).sum() + (ffail.attempts - 1).sum()),
        (mc.REJECTS.name, "faults"): len(frej),
        (mc.REJECTS.name, "counted"): len(live.counted["rejects"]),
    }


def test_counters_match_the_parquet_output(live):
    prom, at = live.prom, live.t_eval
    data, rejects = live.counted["data"], live.counted["rejects"]
    assert len(data) == 150 and len(rejects) == len(BAD_LINES) and live.counted["failures"].empty
    assert (data.attempts == 1).all(), "the counted run must not have retried anything"
    truncated = int((data.finish_reason == "length").sum())
    assert 0 < truncated < len(data), "the counted run should truncate some rows, not all"

    # Replica side: exact, every completion is counted once by the replica that served it.
    assert _total(live, mc.OUTPUT_TOKENS, "counted") == data.completion_tokens.sum()
    assert _total(live, mc.PROMPT_TOKENS, "counted") == data.prompt_tokens.sum()
    by_reason = {s["metric"]["finish_reason"]: float(s["value"][1]) for s in prom.query(
        f"sum by (finish_reason) ({live.sel(mc.COMPLETIONS.prom_name, 'counted')})", at)}
    assert by_reason == data.finish_reason.value_counts().astype(float).to_dict()
    fraction = by_reason.get("length", 0.0) / sum(by_reason.values())
    assert round(fraction, 4) == round(truncated / len(data), 4)
    spec = data.spec_verify_ct.fillna(0) > 0
    assert _total(live, mc.SPEC_OUTPUT_TOKENS, "counted") == data.completion_tokens[spec].sum()
    assert _total(live, mc.SPEC_VERIFY_STEPS, "counted") == data.spec_verify_ct.fillna(0).sum()
    for m in (mc.ACCEPT_LENGTH, mc.REQUEST_LATENCY):  # one observation per completion
        assert prom.value(f"sum({live.sel(m.prom_name + '_count', 'counted')})", at) == len(data)

    # The driver's gauges report what is durably written.
    def gauge(metric: mc.Metric) -> Optional[float]:
        return prom.value(f"max({live.sel(metric.prom_name, 'counted')})", at)

    assert gauge(mc.JOB_INPUT_ROWS) == len(data) + len(BAD_LINES)
    assert gauge(mc.JOB_ROWS_DONE) == len(data)
    assert gauge(mc.JOB_ROWS_FAILED) == 0
    assert gauge(mc.JOB_ROWS_REJECTED) == len(rejects)
    assert gauge(mc.JOB_ROWS_TRUNCATED) == truncated
    assert gauge(mc.JOB_OUTPUT_TOKENS_WRITTEN) == data.completion_tokens.sum()
    assert gauge(mc.JOB_RUNNING) == 0
    assert gauge(mc.JOB_ETA_SECONDS) == 0
    assert gauge(mc.JOB_TRUNCATION_THRESHOLD) == COUNTED_TRUNCATION_RATIO
    assert gauge(mc.JOB_EXPECTED_REPLICAS) == 2  # run_config's serve.autoscaling.min_replicas

    # The category cap: the one generate actor kept the first CATEGORY_LIMIT categories,
    # the others are "other"; every completion is still counted exactly once.
    by_category = {s["metric"]["category"]: float(s["value"][1]) for s in prom.query(
        f"sum by (category) ({live.sel(mc.COMPLETIONS.prom_name, 'counted')})", at)}
    assert len(by_category) == CATEGORY_LIMIT + 1 and "other" in by_category, by_category
    assert set(by_category) - {"other"} < set(data.category)
    assert sum(by_category.values()) == len(data)

    # Job side (counted by the driver from durable rows): never more than the output
    # says, and the fault run's counters exist. Exact equality: the test below.
    fdata, ffail = live.faults["data"], live.faults["failures"]
    assert len(ffail) > 0 and (fdata.attempts > 1).any(), "the fault run produced no failures/retries"
    for (name, role), want in _job_side_expected(live).items():
        got = _total(live, mc.BY_NAME[name], role)
        assert got <= want, f"{name} of run {role}: {got} counted, {want} in the output"
        if role == "faults":
            assert got > 0, f"{name} of run {role}: nothing exported ({want} in the output)"


def test_job_side_counters_match_the_output(live):
    got = {key: _total(live, mc.BY_NAME[key[0]], key[1]) for key in _job_side_expected(live)}
    assert got == {k: float(v) for k, v in _job_side_expected(live).items()}


def test_sglang_metrics_arrive_under_sglangs_names_per_replica(live):
    """The relay + the repo's relabel rule: SGLang's exact series, one per replica."""
    prom = live.prom
    names = set(prom.api("label/__name__/values", **{"match[]": '{__name__=~"sglang:.*"}'}))
    assert mc.SGLANG_SERIES <= names, f"missing: {sorted(mc.SGLANG_SERIES - names)}"
    assert not prom.api("label/__name__/values", **{"match[]": '{__name__=~"ray_relay_sglang_.*"}'}), \
        "relayed series left under their Ray name"
    # The copy for Ray's SGLang dashboard: only families that dashboard reads.
    ray_names = prom.api("label/__name__/values", **{"match[]": '{__name__=~"ray_sglang_.*"}'})
    assert ray_names and {rd.family(n) for n in ray_names} <= mc.RAY_DASHBOARD_SGLANG_FAMILIES, ray_names
    # Every replica's engine: the counted run went through both replicas of the app.
    per_replica = prom.query(f'sum by (replica, model_name) (sglang:time_to_first_token_seconds_count'
                             f'{{application="{APP}"}})', live.t_eval)
    assert len(per_replica) == 2 and {s["metric"]["model_name"] for s in per_replica} == {MODEL}
    # The relayed request counter is the engine's own: each replica's total is >= the
    # requests raygen's counters saw it complete in the counted run.
    engine_requests = prom.value(f'sum(sglang:num_requests_total{{application="{APP}"}})', live.t_eval)
    assert engine_requests >= len(live.counted["data"])


def test_ray_provisions_raygens_dashboard_next_to_its_own(ray_cluster):
    """The ray_cluster fixture starts Ray with RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR
    (tests/integration/conftest.py): Ray writes its dashboards into that folder, keeps
    raygen's, and points its Grafana provisioning at it (see dashboards/README.md)."""
    folder = Path(os.environ["RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR"])
    provisioning = session_dir() / "metrics" / "grafana" / "provisioning" / "dashboards" / "default.yml"
    rays = {"default_grafana_dashboard.json", "data_grafana_dashboard.json"}
    # The dashboard process writes them when its metrics module starts.
    wait_for("Ray's dashboards and provisioning", lambda: provisioning.exists() and rays <= {
        p.name for p in folder.iterdir()}, 60)
    assert (folder / build.DASHBOARD_JSON.name).read_text() == build.DASHBOARD_JSON.read_text()
    provider = yaml.safe_load(provisioning.read_text())
    (ray_provider,) = provider["providers"]
    assert ray_provider["options"]["path"] == str(folder)


def test_every_catalog_metric_is_exported(live):
    names = set(live.prom.api("label/__name__/values", **{"match[]": '{__name__=~"ray_raygen_.*"}'}))
    print(f"\nray_raygen_* metric names seen live ({len(names)}): {sorted(names)}")
    missing = sorted(set(mc.SERIES_NAMES) - names)
    assert not missing, f"catalogued but never exported: {missing}"
    # Anything else must be the deprecated counter-as-gauge twin of a catalogued counter.
    legacy = {m.prom_name.removesuffix("_total") for m in mc.CATALOG if m.type == mc.COUNTER}
    unknown = sorted(names - set(mc.SERIES_NAMES) - legacy)
    assert not unknown, f"exported but not in the catalog: {unknown}"
