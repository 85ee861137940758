"""The integrity guard's counters, per producing replica: rows checked and rows flagged
(by flag), emitted by the generate actors as rows are built. ``engine_replica`` is the
Serve replica id the result names: the value of the ``replica`` label on that replica's
own series (raygen's labels never reuse Serve's names, dashboards/metrics_catalog.py), so
a flagged rate lines up with the replica's engine metrics and accept length."""

from __future__ import annotations

from dashboards import metrics_catalog as mc


class IntegrityCounters:
    def __init__(self, run: str, model: str):
        from ray.util import metrics  # in the actor only: keeps this importable without ray

        self.tags = {"run": run, "model": model}
        self.checked = metrics.Counter(mc.ROWS_CHECKED.name, mc.ROWS_CHECKED.description,
                                       tag_keys=mc.ROWS_CHECKED.labels)
        self.flagged = metrics.Counter(mc.ROWS_FLAGGED.name, mc.ROWS_FLAGGED.description,
                                       tag_keys=mc.ROWS_FLAGGED.labels)

    def record(self, replica: str, flags: list[str]) -> None:
        tags = dict(self.tags, engine_replica=replica or "unknown")
        self.checked.inc(1, tags)
        for flag in flags:
            self.flagged.inc(1, dict(tags, flag=flag))
