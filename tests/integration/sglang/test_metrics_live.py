"""SGLang's real ``sglang:*`` series, relayed by raygen's replicas, in a real Prometheus.

A private Prometheus (tests/support/prometheus.py: the repo's scrape config and rules)
scrapes this session's Ray cluster while a run streams through the pool of real engines
long enough to span several of Ray's 10 s metric reports. Then every dashboard panel
that reads SGLang's series returns data for the real engines, every panel and alert
expression evaluates on them, the series arrive under SGLang's own names once per
replica, and the engines' own token counters cover what the run wrote. Every
expression of Ray's own "Serve LLM SGLang" dashboard (read from the installed Ray, its
variables filled as Grafana fills them for raygen's replicas) returns data for them too,
from the ray_sglang_* copy the relay exports under Ray's names.
"""

from __future__ import annotations

import json
import math
import time
import urllib.request

import pytest
import yaml

from dashboards import alerts, build
from dashboards import metrics_catalog as mc
from tests.integration.helpers import read, run, sglang_config, write_prompts
from tests.support import ray_dashboards as rd
from tests.support import sglang_cpu
from tests.support.prometheus import (INTERVAL_S, PromError, panel_targets, running_prometheus,
                                      substitute, wait_for)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.prometheus]

# ~22K tokens: a run of ~10-20 s on two CPU engines (prompts of ~95 tokens + 140 fit 256),
# with Ray's metric reports before, during and after it; every panel's window spans the
# whole session (its __rate_interval), so a longer run adds no series, only minutes
ROWS, TOKENS = 160, 140
APP_SEL = f'application="{sglang_cpu.APP}"'

# Targets of Ray's Serve LLM SGLang dashboard ("title [refId]") that cannot return data
# for raygen's replicas for a reason outside raygen, with that reason. Each must stay
# empty: one that returns data fails the test until it is taken off this list. None on
# SGLang 0.5.23's CPU engine: it writes every family the dashboard reads (the aborted
# requests counter once an abort happened, see the fixture).
RAY_DASHBOARD_EXEMPT: dict[str, str] = {}


def _engine_tokens(prom, at=None, name="sglang:generation_tokens_total") -> dict[str, float]:
    """SGLang's own generation-token counter per replica, as relayed and scraped."""
    return {s["metric"]["replica"]: float(s["value"][1]) for s in prom.query(
        f"sum by (replica) ({name}{{{APP_SEL}}})", at)}


def _wait_aborted(prom, pool, n: int) -> None:
    wait_for(f"each engine's aborted-requests counter at {n}, under Ray's name", lambda: len(prom.query(
        f"ray_sglang_num_aborted_requests_total{{{APP_SEL}}} >= {n}")) == len(pool.urls), 90, every_s=INTERVAL_S)


def _abort_all(pool, prom, n: int) -> None:
    """The n-th abort on every engine (SGLang counts an abort_all as one aborted request).
    The second waits until Prometheus holds the first, so the counter is seen to rise."""
    if n > 1:
        _wait_aborted(prom, pool, n - 1)
    for url in pool.urls:
        req = urllib.request.Request(f"{url}/abort_request", data=json.dumps({"abort_all": True}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200, (url, resp.status)


@pytest.fixture(scope="module")
def live(sglang_pool, s3_endpoint, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sglang-metrics")
    rows = write_prompts(tmp / "p.jsonl", ROWS)
    tree = sglang_config(tmp, s3_endpoint, rows_file=str(rows), model_path=sglang_pool.model,
                         job={"max_new_tokens": TOKENS,
                              "sampling": {"temperature": 0.0, "ignore_eos": True}})
    (tmp / "prometheus").mkdir()
    with running_prometheus(tmp / "prometheus") as prom:
        t0 = time.time()
        # A sound run aborts nothing, and SGLang creates its aborted-requests counter at
        # the first abort: each engine is asked to abort (what an operator's abort or a
        # client gone costs) before the run and after it, with nothing running, so Ray's
        # "Aborted Requests / s" panel sees the counter rise.
        _abort_all(sglang_pool, prom, 1)
        assert run(tree).status == "succeeded"
        data = read(tree, "data")
        wrote = data.groupby("replica").completion_tokens.sum().to_dict()
        _abort_all(sglang_pool, prom, 2)
        # Each replica relays its engine's counters every few seconds and Ray reports
        # every ~10 s: wait until every engine's counter covers what raygen wrote from it.
        wait_for(f"each engine's token counter to reach the tokens written from it {wrote}",
                 lambda: all(engine.get(r, 0) >= n for engine in [_engine_tokens(prom)]
                             for r, n in wrote.items()), 90, every_s=INTERVAL_S)
        _wait_aborted(prom, sglang_pool, 2)
        t_eval = time.time()
        yield prom, data, t0, t_eval, f"{math.ceil(t_eval - prom.started) + 5}s"


def test_engine_panels_show_the_real_engines(live):
    prom, _, _, t_eval, window = live
    values = {"run": ".*", "model": sglang_cpu.SERVED_NAME, "datasource": "unused",
              "__rate_interval": window, "__interval": f"{INTERVAL_S}s"}
    errors, empty = [], []
    engine_targets = 0
    for title, expr in panel_targets():
        try:
            result = prom.query(substitute(expr, values), t_eval)
        except PromError as exc:
            errors.append(f"{title}: {exc}")
            continue
        if "sglang:" in expr:
            engine_targets += 1
            if not result:
                empty.append(title)
    assert not errors, "panel queries failed on the real engines' data:\n" + "\n".join(errors)
    assert engine_targets >= 10
    assert not empty, f"engine panels with no series from SGLang's real engines: {empty}"


def test_every_rule_and_alert_evaluates_on_the_real_series(live):
    prom, _, t0, t_eval, _ = live
    (group,) = yaml.safe_load(build.RULES_YML.read_text())["groups"]
    (loaded,) = [g for g in prom.api("rules")["groups"] if g["name"] == alerts.GROUP]
    assert len(loaded["rules"]) == len(group["rules"])
    assert [(r["name"], r.get("lastError")) for r in loaded["rules"] if r["health"] != "ok"] == []
    engine_signals = []
    for a in alerts.ALERTS:
        for expr in (a.expr, alerts.inline_recording_rules(a.expr), a.query):
            prom.query(expr, t_eval)  # raises PromError on a bad expression
        if "sglang:" in alerts.inline_recording_rules(a.query):
            engine_signals.append(a.name)
            assert prom.query_range(alerts.inline_recording_rules(a.query), t0, t_eval), a.name
    print(f"\nalerts reading SGLang's series: {engine_signals}")


def test_sglang_series_arrive_under_sglangs_names_once_per_replica(live):
    prom, data, _, t_eval, _ = live
    per_replica = prom.query(f"sum by (replica, model_name) "
                             f"(sglang:time_to_first_token_seconds_count{{{APP_SEL}}})", t_eval)
    assert len(per_replica) == 2, per_replica
    assert {s["metric"]["model_name"] for s in per_replica} == {sglang_cpu.SERVED_NAME}
    assert not prom.api("label/__name__/values", **{"match[]": '{__name__=~"ray_relay_sglang_.*"}'}), \
        "relayed series left under their Ray name"
    # The copy under Ray's names: only families Ray's SGLang dashboard reads, the same values.
    ray_names = prom.api("label/__name__/values", **{"match[]": f'{{__name__=~"ray_sglang_.*", {APP_SEL}}}'})
    assert {rd.family(n) for n in ray_names} == mc.RAY_DASHBOARD_SGLANG_FAMILIES, sorted(ray_names)
    assert _engine_tokens(prom, t_eval, "ray_sglang_generation_tokens_total") == _engine_tokens(prom, t_eval)
    series = {name: {s["metric"]["replica"]: int(float(s["value"][1])) for s in prom.query(
        f'count by (replica) ({{__name__=~"{name}.+", {APP_SEL}}})', t_eval)}
        for name in ("sglang:", "ray_sglang_")}
    print(f"\nseries per replica: sglang:* {series['sglang:']}, ray_sglang_* {series['ray_sglang_']}")
    assert set(series["ray_sglang_"]) == set(series["sglang:"]) == set(_engine_tokens(prom, t_eval))
    # SGLang's own counters cover, per replica, the tokens raygen wrote from it.
    engine = _engine_tokens(prom, t_eval)
    wrote = data.groupby("replica").completion_tokens.sum().to_dict()
    assert set(wrote) <= set(engine), (wrote, engine)
    assert all(engine[r] >= tokens for r, tokens in wrote.items()), (wrote, engine)


def test_every_expression_of_rays_sglang_dashboard_returns_data_for_raygens_replicas(live):
    """Ray's Serve LLM SGLang dashboard as the installed Ray provisions it, its variables
    filled as Grafana fills them when a user picks raygen's model and deployment (each
    offered by the variable's own query) and leaves Cluster at All, its default."""
    prom, data, _, t_eval, _ = live
    dashboard = rd.sglang_dashboard()
    variables = rd.variables(dashboard)
    deployments = {s["metric"]["deployment"] for s in prom.query(
        f"group by (deployment) (sglang:num_running_reqs{{{APP_SEL}}})", t_eval)}
    picked = {"sglang_model_name": [sglang_cpu.SERVED_NAME], "deployment": sorted(deployments)}
    for name, want in picked.items():
        selector, label = rd.label_values_query(variables[name])
        offered = prom.api(f"label/{label}/values", **{"match[]": selector})
        assert set(want) <= set(offered), f"variable {name} offers {offered}, not raygen's {want}"
    values = {name: rd.grafana_value(v, picked.get(name)) for name, v in variables.items()
              if name != "datasource"}
    writers = set(data.replica)  # replicas that served rows in the window: every rate has data
    exprs = rd.targets(dashboard)
    assert len(exprs) >= 25, exprs
    empty, missing_replicas, unneeded = [], {}, []
    for title, expr in exprs:
        result = prom.query(substitute(expr, values), t_eval)  # raises PromError on a bad one
        if title in RAY_DASHBOARD_EXEMPT:
            if result:
                unneeded.append(title)
            continue
        if not result:
            empty.append(title)
            continue
        replicas = {s["metric"]["replica"] for s in result if "replica" in s["metric"]}
        if "replica" in result[0]["metric"] and not writers <= replicas:
            missing_replicas[title] = sorted(writers - replicas)
    assert not empty, f"Ray's SGLang dashboard shows nothing for raygen's replicas in: {empty}"
    assert not missing_replicas, f"per-replica expressions missing raygen's replicas: {missing_replicas}"
    assert not unneeded, f"exempt but returning data now; take them off RAY_DASHBOARD_EXEMPT: {unneeded}"
    assert set(RAY_DASHBOARD_EXEMPT) <= {title for title, _ in exprs}, "exemption of a target that is gone"
