"""Recording rules and alerts, rendered both as Prometheus rules and as
Grafana-managed alert provisioning, from one definition.

Each alert is ``<query> <op> <threshold>``: the query yields the value a human
wants to see (a fraction, seconds, a ratio to the baseline), which keeps the
annotations readable and maps 1:1 onto Grafana's query -> reduce -> threshold
pipeline.  Prometheus alerts may use the recording rules; Grafana alerts get
them inlined so they work against any Prometheus that scrapes Ray, even one
that does not load raygen_rules.yml.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional

from dashboards import metrics_catalog as mc
from dashboards import promql as q
from dashboards import signals as s
from dashboards import thresholds as t

# Where the runbook (the "Alerts and runbook" sections of dashboards/README.md) is
# published; every alert's runbook_url is this plus "#<alertname lowercased>". Change
# it here when you fork/publish (YOUR_ORG as in cluster/), rebuild, commit.
RUNBOOK_BASE_URL = "https://github.com/YOUR_ORG/raygen/blob/main/dashboards/README.md"
RUNBOOK_DOC = "dashboards/README.md"  # the file RUNBOOK_BASE_URL renders (tests check its anchors)
GROUP = "raygen"
RUN_MODEL = s.RUN_MODEL


def record_name(signal: str, op: str, window: str) -> str:
    return f"raygen:{signal}:{op}{window}"


TPS_SHORT = record_name("output_tokens_per_second", "rate", t.THROUGHPUT_SHORT_WINDOW)
TPS_LONG = record_name("output_tokens_per_second", "rate", t.THROUGHPUT_LONG_WINDOW)
FAIL = record_name("failure_ratio", "rate", t.FAILURE_WINDOW)
ACCEPT_SHORT = record_name("accept_length", "rate", t.ACCEPT_LENGTH_SHORT_WINDOW)
ACCEPT_LONG = record_name("accept_length", "rate", t.ACCEPT_LENGTH_LONG_WINDOW)
# Per replica: the sums the per-replica alerts compare with the rest of the fleet.
CHECKED_PER_REPLICA = record_name("rows_checked_per_replica", "rate", t.REPLICA_FLAGGED_WINDOW)
FLAGS_PER_REPLICA = record_name("flags_per_replica", "rate", t.REPLICA_FLAGGED_WINDOW)
SPEC_TOKENS_PER_REPLICA = record_name("spec_output_tokens_per_replica", "rate", t.REPLICA_ACCEPT_LENGTH_WINDOW)
SPEC_STEPS_PER_REPLICA = record_name("spec_verify_steps_per_replica", "rate", t.REPLICA_ACCEPT_LENGTH_WINDOW)

RECORDING_RULES: Dict[str, str] = {
    TPS_SHORT: s.output_tps(t.THROUGHPUT_SHORT_WINDOW),
    TPS_LONG: s.output_tps(t.THROUGHPUT_LONG_WINDOW),
    FAIL: s.failure_ratio(t.FAILURE_WINDOW),
    ACCEPT_SHORT: s.accept_length(t.ACCEPT_LENGTH_SHORT_WINDOW),
    ACCEPT_LONG: s.accept_length(t.ACCEPT_LENGTH_LONG_WINDOW),
    CHECKED_PER_REPLICA: s.rows_checked(t.REPLICA_FLAGGED_WINDOW, s.ENGINE_REPLICA),
    FLAGS_PER_REPLICA: s.flags(t.REPLICA_FLAGGED_WINDOW, s.ENGINE_REPLICA),
    SPEC_TOKENS_PER_REPLICA: q.sum_rate(mc.SPEC_OUTPUT_TOKENS.prom_name, t.REPLICA_ACCEPT_LENGTH_WINDOW,
                                        s.SERVE_REPLICA),
    SPEC_STEPS_PER_REPLICA: q.sum_rate(mc.SPEC_VERIFY_STEPS.prom_name, t.REPLICA_ACCEPT_LENGTH_WINDOW,
                                       s.SERVE_REPLICA),
}

# How $value is shown: (Prometheus template, Grafana template).  Grafana's
# $value is a debug string of all refIds, so it needs $values.B.Value (B = reduce).
_FMT = {
    "percent": ("{{ $value | humanizePercentage }}", "{{ humanizePercentage $values.B.Value }}"),
    "duration": ("{{ $value | humanizeDuration }}", "{{ humanizeDuration $values.B.Value }}"),
    "number": ('{{ printf "%.2f" $value }}', '{{ printf "%.2f" $values.B.Value }}'),
}


@dataclass(frozen=True)
class Alert:
    name: str
    query: str  # may reference RECORDING_RULES
    op: str  # ">" or "<": the threshold types every Grafana version with threshold expressions supports
    threshold: float
    for_: str
    severity: str
    summary: str
    description: str  # "<VALUE>", if present, becomes the formatted current value
    value_format: str
    panel_key: str  # dashboard panel the Grafana alert links to
    keep_firing_for: Optional[str] = None  # Prometheus only (Grafana's provisioning has no equivalent)

    @property
    def expr(self) -> str:
        return q.compare(self.query, self.op, self.threshold)

    @property
    def runbook_url(self) -> str:
        return f"{RUNBOOK_BASE_URL}#{self.name.lower()}"

    def annotations(self, grafana: bool) -> Dict[str, str]:
        value = _FMT[self.value_format][1 if grafana else 0]
        return {
            "summary": self.summary,
            "description": self.description.replace("<VALUE>", value),
            "runbook_url": self.runbook_url,
        }


_ENGINE_UP_PER_REPLICA = q.min_by(("model", "deployment", "replica"), mc.ENGINE_UP.prom_name)
# A model whose job is running but that has no engine_up series at all: every
# replica is gone (or never came up), so the per-replica branch has nothing to see.
_NO_REPLICA_METRICS = q.unless_on(
    ("model",),
    f"(0 * {s.job_running(by=('model',))})",
    q.count_by(("model",), mc.ENGINE_UP.prom_name),
)
_RUN_TRUNCATION_VS_THRESHOLD = q.and_on(
    RUN_MODEL,
    f"({s.run_truncated_fraction()} / on ({', '.join(RUN_MODEL)}) {s.truncation_threshold()})",
    f"({q.max_by(RUN_MODEL, mc.JOB_ROWS_DONE.prom_name)} >= {t.TRUNCATION_MIN_ROWS})")
_HEALTHY_VS_EXPECTED = q.ratio_if_positive(
    q.or_zero(s.healthy_replicas(), s.expected_replicas()), s.expected_replicas())
_DRIVER_LAST_SEEN_RUNNING = (
    f"({q.max_by(RUN_MODEL, f'last_over_time({mc.JOB_RUNNING.prom_name}[{t.DRIVER_GONE_LOOKBACK}])')} == 1)"
)
_FINISHED_ALL_ROWS = (
    f"({s.rows_finished(over=t.DRIVER_GONE_LOOKBACK)} >= "
    f"{q.max_by(RUN_MODEL, f'last_over_time({mc.JOB_INPUT_ROWS.prom_name}[{t.DRIVER_GONE_LOOKBACK}])')})"
)

# RaygenReplicaOutputsFlagged: the replica's flags per checked row (only with enough rows
# checked), above max(floor, multiple x the rest of its fleet's rate). The rest of the
# fleet, not the whole fleet: with two replicas, one broken, the whole fleet's rate is
# half the broken one's and a 3x bar could never be crossed. No rest of fleet (a lone
# replica, or the others checked nothing) = 0, so the floor alone applies.
_REPLICA_FLAGGED = q.ratio_if_at_least(
    FLAGS_PER_REPLICA, CHECKED_PER_REPLICA, q.per_window(t.REPLICA_FLAGGED_MIN_ROWS, t.REPLICA_FLAGGED_WINDOW))
_REST_OF_FLEET_FLAGGED = q.or_zero(
    q.ratio_if_positive(q.rest_of(s.FLEET, FLAGS_PER_REPLICA), q.rest_of(s.FLEET, CHECKED_PER_REPLICA)),
    CHECKED_PER_REPLICA)
_FLAGGED_BAR = (f"clamp_min({t.REPLICA_FLAGGED_FLEET_MULTIPLE:g} * {_REST_OF_FLEET_FLAGGED}, "
                f"{t.REPLICA_FLAGGED_RATIO_MIN:g})")
# RaygenReplicaAcceptLengthLow: the replica's accept length / the rest of its fleet's,
# both from counters (sum(tokens) / sum(steps)) and both with enough verify steps.
_ENOUGH_STEPS = q.per_window(t.REPLICA_ACCEPT_LENGTH_MIN_STEPS, t.REPLICA_ACCEPT_LENGTH_WINDOW)
_REPLICA_ACCEPT_LENGTH = q.ratio_if_at_least(SPEC_TOKENS_PER_REPLICA, SPEC_STEPS_PER_REPLICA, _ENOUGH_STEPS)
_REST_OF_FLEET_ACCEPT_LENGTH = q.ratio_if_at_least(
    q.rest_of(s.FLEET, SPEC_TOKENS_PER_REPLICA), q.rest_of(s.FLEET, SPEC_STEPS_PER_REPLICA), _ENOUGH_STEPS)
_REPLICA_VS_REST_ACCEPT_LENGTH = f"({_REPLICA_ACCEPT_LENGTH} / {_REST_OF_FLEET_ACCEPT_LENGTH})"

ALERTS: List[Alert] = [
    Alert(
        name="RaygenTruncationHigh",
        query=_RUN_TRUNCATION_VS_THRESHOLD,
        op=">", threshold=1, for_=t.TRUNCATION_FOR, severity="warning",
        keep_firing_for=t.TRUNCATION_KEEP_FIRING_FOR,
        summary="raygen run {{ $labels.run }}: truncation above the run's threshold",
        description="Rows of run {{ $labels.run }} (model {{ $labels.model }}) that hit max_new_tokens "
                    "(finish_reason=length) are <VALUE> of the run's threshold (job.truncation_alert_ratio), "
                    f"counted over everything written so far (at least {t.TRUNCATION_MIN_ROWS} rows).",
        value_format="percent", panel_key="truncated_fraction",
    ),
    Alert(
        name="RaygenThroughputDrop",
        query=q.and_on(
            RUN_MODEL, q.ratio_if_positive(q.or_zero(TPS_SHORT, TPS_LONG), TPS_LONG), s.job_running()),
        op="<", threshold=t.THROUGHPUT_DROP_RATIO, for_=t.THROUGHPUT_FOR, severity="warning",
        summary="raygen run {{ $labels.run }}: output tok/s dropped below "
                f"{t.THROUGHPUT_DROP_RATIO:.0%} of the {t.THROUGHPUT_LONG_WINDOW} average",
        description=f"Output tokens/s of model {{{{ $labels.model }}}} over the last {t.THROUGHPUT_SHORT_WINDOW} "
                    f"is <VALUE> of its {t.THROUGHPUT_LONG_WINDOW} average while the job is running.",
        value_format="percent", panel_key="output_tps",
    ),
    Alert(
        name="RaygenFailureRateHigh",
        query=FAIL,
        op=">", threshold=t.FAILURE_RATIO_MAX, for_=t.FAILURE_FOR, severity="critical",
        summary="raygen run {{ $labels.run }}: failure rate above " f"{t.FAILURE_RATIO_MAX:.0%}",
        description=f"<VALUE> of finished rows failed (failures / (completions + failures)) over the last "
                    f"{t.FAILURE_WINDOW}; threshold {t.FAILURE_RATIO_MAX:.0%}.",
        value_format="percent", panel_key="failure_ratio",
    ),
    Alert(
        name="RaygenRunStalled",
        query=q.and_on(RUN_MODEL, s.seconds_since_last_write(), s.job_running()),
        op=">", threshold=t.STALL_SECONDS, for_=t.STALL_FOR, severity="critical",
        summary="raygen run {{ $labels.run }}: no durable write for "
                f"{t.STALL_SECONDS // 60}m",
        description="The job driver is running but its newest durable write is <VALUE> old "
                    f"(threshold {t.STALL_SECONDS // 60}m).",
        value_format="duration", panel_key="stall",
    ),
    Alert(
        name="RaygenEngineDown",
        query=f"({_ENGINE_UP_PER_REPLICA} or {_NO_REPLICA_METRICS})",
        op="<", threshold=1, for_=t.ENGINE_DOWN_FOR, severity="critical",
        summary="raygen model {{ $labels.model }}: engine down "
                "{{ if $labels.replica }}on replica {{ $labels.replica }}{{ else }}(no replica metrics){{ end }}",
        description="{{ if $labels.replica }}Replica {{ $labels.replica }} of model {{ $labels.model }} reports "
                    "engine_up=0{{ else }}No replica of model {{ $labels.model }} exports metrics while its job is "
                    f"running{{{{ end }}}} (for {t.ENGINE_DOWN_FOR}).",
        value_format="number", panel_key="engine_up",
    ),
    Alert(
        name="RaygenReplicasBelowExpected",
        query=_HEALTHY_VS_EXPECTED,
        op="<", threshold=1, for_=t.REPLICAS_BELOW_FOR, severity="warning",
        summary="raygen model {{ $labels.model }}: fewer healthy replicas than the run expects",
        description="Healthy engine replicas of model {{ $labels.model }} are <VALUE> of what its running job "
                    f"expects (serve.autoscaling.min_replicas), for {t.REPLICAS_BELOW_FOR}.",
        value_format="percent", panel_key="replicas",
    ),
    Alert(
        name="RaygenAcceptLengthDrop",
        query=q.ratio_if_positive(ACCEPT_SHORT, ACCEPT_LONG),
        op="<", threshold=t.ACCEPT_LENGTH_DROP_RATIO, for_=t.ACCEPT_LENGTH_FOR, severity="warning",
        summary="raygen run {{ $labels.run }}: speculative accept length dropped",
        description=f"Accept length of model {{{{ $labels.model }}}} over the last {t.ACCEPT_LENGTH_SHORT_WINDOW} "
                    f"is <VALUE> of its {t.ACCEPT_LENGTH_LONG_WINDOW} average "
                    f"(threshold {t.ACCEPT_LENGTH_DROP_RATIO:.0%}).",
        value_format="percent", panel_key="accept_length",
    ),
    Alert(
        name="RaygenReplicaAcceptLengthLow",
        query=_REPLICA_VS_REST_ACCEPT_LENGTH,
        op="<", threshold=t.REPLICA_ACCEPT_LENGTH_RATIO, for_=t.REPLICA_ACCEPT_LENGTH_FOR, severity="warning",
        summary="raygen run {{ $labels.run }}: replica {{ $labels.replica }} accepts fewer draft tokens "
                "than the rest of its fleet",
        description=f"Accept length of replica {{{{ $labels.replica }}}} (model {{{{ $labels.model }}}}) over the "
                    f"last {t.REPLICA_ACCEPT_LENGTH_WINDOW} is <VALUE> of the other replicas' of the run "
                    f"(threshold {t.REPLICA_ACCEPT_LENGTH_RATIO:.0%}; at least "
                    f"{t.REPLICA_ACCEPT_LENGTH_MIN_STEPS} verify steps on each side).",
        value_format="percent", panel_key="replica_accept_length",
    ),
    Alert(
        name="RaygenReplicaOutputsFlagged",
        query=f"({_REPLICA_FLAGGED} > {_FLAGGED_BAR})",
        op=">", threshold=0, for_=t.REPLICA_FLAGGED_FOR, severity="critical",
        summary="raygen run {{ $labels.run }}: replica {{ $labels.engine_replica }} writes broken outputs",
        description=f"Rows replica {{{{ $labels.engine_replica }}}} (model {{{{ $labels.model }}}}) produced over "
                    f"the last {t.REPLICA_FLAGGED_WINDOW} carry <VALUE> integrity flags per row, above the larger "
                    f"of {t.REPLICA_FLAGGED_RATIO_MIN:.0%} and {t.REPLICA_FLAGGED_FLEET_MULTIPLE:g}x the other "
                    f"replicas' rate (at least {t.REPLICA_FLAGGED_MIN_ROWS} rows checked).",
        value_format="percent", panel_key="replica_flagged",
    ),
    Alert(
        name="RaygenJobDriverGone",
        query=q.unless_on(
            RUN_MODEL,
            q.unless_on(RUN_MODEL, _DRIVER_LAST_SEEN_RUNNING, q.max_by(RUN_MODEL, mc.JOB_RUNNING.prom_name)),
            _FINISHED_ALL_ROWS),
        op=">", threshold=0, for_=t.DRIVER_GONE_FOR, severity="critical",
        summary="raygen run {{ $labels.run }}: job driver disappeared mid-run",
        description="The driver last reported job_running=1 but its metrics are gone and not all rows "
                    f"were written (looked back {t.DRIVER_GONE_LOOKBACK}).",
        value_format="number", panel_key="driver_running",
    ),
]

ALERTS_BY_NAME = {a.name: a for a in ALERTS}


def inline_recording_rules(expr: str) -> str:
    """Replace recording-rule names with their (parenthesised) definitions."""
    for name, definition in RECORDING_RULES.items():
        expr = re.sub(rf"(?<![\w:]){re.escape(name)}(?![\w:])", lambda _m, d=definition: f"({d})", expr)
    return expr


def prometheus_rules() -> dict:
    """The rules file as a dict (one group: recording rules first, so alerts in
    the same evaluation see this cycle's values)."""
    rules: list = [{"record": name, "expr": expr} for name, expr in RECORDING_RULES.items()]
    for a in ALERTS:
        rule = {"alert": a.name, "expr": a.expr, "for": a.for_}
        if a.keep_firing_for:
            rule["keep_firing_for"] = a.keep_firing_for
        rule.update(labels={"severity": a.severity}, annotations=a.annotations(grafana=False))
        rules.append(rule)
    return {"groups": [{"name": GROUP, "rules": rules}]}


GRAFANA_DATASOURCE_UID = "raygen-prometheus"  # fixed in provisioning/datasources/raygen.yml
GRAFANA_FOLDER = "raygen"
_EVALUATOR = {">": "gt", "<": "lt"}


def _expr_ds() -> dict:
    # A fresh dict each time: a shared one makes PyYAML emit &anchors/*aliases.
    return {"type": "__expr__", "uid": "__expr__"}


def grafana_alert_rule(a: Alert, dashboard_uid: str, panel_id: int) -> dict:
    """One Grafana-managed rule: A = instant PromQL, B = reduce(last), C = threshold."""
    return {
        "uid": "raygen-" + re.sub(r"(?<!^)(?=[A-Z])", "-", a.name.removeprefix("Raygen")).lower(),
        "title": a.name,
        "condition": "C",
        "data": [
            {
                "refId": "A",
                "relativeTimeRange": {"from": 600, "to": 0},
                "datasourceUid": GRAFANA_DATASOURCE_UID,
                "model": {
                    "refId": "A",
                    "datasource": {"type": "prometheus", "uid": GRAFANA_DATASOURCE_UID},
                    "expr": inline_recording_rules(a.query),
                    "instant": True,
                    "range": False,
                    "intervalMs": 1000,
                    "maxDataPoints": 43200,
                },
            },
            {
                "refId": "B",
                "datasourceUid": "__expr__",
                "model": {"refId": "B", "datasource": _expr_ds(), "type": "reduce", "expression": "A",
                          "reducer": "last"},
            },
            {
                "refId": "C",
                "datasourceUid": "__expr__",
                "model": {"refId": "C", "datasource": _expr_ds(), "type": "threshold", "expression": "B",
                          "conditions": [{"evaluator": {"type": _EVALUATOR[a.op], "params": [a.threshold]}}]},
            },
        ],
        "dashboardUid": dashboard_uid,
        "panelId": panel_id,
        # No series = healthy for every query above (they only return the
        # evaluable / bad cases), so NoData must not page.
        "noDataState": "OK",
        "execErrState": "Error",
        "for": a.for_,
        "labels": {"severity": a.severity},
        # Grafana does not env-interpolate annotations, so {{ $labels.x }} is safe here.
        "annotations": a.annotations(grafana=True),
    }


def grafana_alerting(dashboard_uid: str, panel_ids: Dict[str, int]) -> dict:
    return {
        "apiVersion": 1,
        "groups": [{
            "orgId": 1,
            "name": GROUP,
            "folder": GRAFANA_FOLDER,
            "interval": "30s",
            "rules": [grafana_alert_rule(a, dashboard_uid, panel_ids[a.panel_key]) for a in ALERTS],
        }],
    }
