"""SGLang's real ``sglang:*`` series, relayed by raygen's replicas, in a real Prometheus.

A private Prometheus (tests/support/prometheus.py: the repo's scrape config and rules)
scrapes this session's Ray cluster while a run streams through the pool of real engines
long enough to span several of Ray's 10 s metric reports. Then every dashboard panel
that reads SGLang's series returns data for the real engines, every panel and alert
expression evaluates on them, the series arrive under SGLang's own names once per
replica, and the engines' own token counters cover what the run wrote.
"""

from __future__ import annotations

import math
import time

import pytest
import yaml

from dashboards import alerts, build
from tests.integration.helpers import read, run, sglang_config, write_prompts
from tests.support import sglang_cpu
from tests.support.prometheus import (INTERVAL_S, PromError, panel_targets, running_prometheus,
                                      substitute, wait_for)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.prometheus]

# ~56K tokens: a run of 20-40 s on two CPU engines (prompts of ~95 tokens + 140 fit 256)
ROWS, TOKENS = 400, 140
APP_SEL = f'application="{sglang_cpu.APP}"'


def _engine_tokens(prom, at=None) -> dict[str, float]:
    """SGLang's own generation-token counter per replica, as relayed and scraped."""
    return {s["metric"]["replica"]: float(s["value"][1]) for s in prom.query(
        f"sum by (replica) (sglang:generation_tokens_total{{{APP_SEL}}})", at)}


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
        assert run(tree).status == "succeeded"
        data = read(tree, "data")
        wrote = data.groupby("replica").completion_tokens.sum().to_dict()
        # Each replica relays its engine's counters every few seconds and Ray reports
        # every ~10 s: wait until every engine's counter covers what raygen wrote from it.
        wait_for(f"each engine's token counter to reach the tokens written from it {wrote}",
                 lambda: all(engine.get(r, 0) >= n for engine in [_engine_tokens(prom)]
                             for r, n in wrote.items()), 90, every_s=INTERVAL_S)
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
    assert not prom.api("label/__name__/values", **{"match[]": '{__name__=~"ray_sglang_.*"}'}), \
        "relayed series left under their Ray name"
    # SGLang's own counters cover, per replica, the tokens raygen wrote from it.
    engine = _engine_tokens(prom, t_eval)
    wrote = data.groupby("replica").completion_tokens.sum().to_dict()
    assert set(wrote) <= set(engine), (wrote, engine)
    assert all(engine[r] >= tokens for r, tokens in wrote.items()), (wrote, engine)
