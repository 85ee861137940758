"""A stand-in for ray.util.metrics.Gauge that records what a relay sets (the relay's own
Ray metrics need a running Ray; the unit tier has none)."""

from __future__ import annotations


class RecordingGauge:
    """Records each set() by its sorted tags; a tag the gauge was not made with fails."""

    made: dict = {}

    def __init__(self, name, description="", tag_keys=()):
        self.name, self.tag_keys, self.values = name, tuple(tag_keys), {}
        RecordingGauge.made[name] = self

    def set(self, value, tags):
        assert set(tags) == set(self.tag_keys), (tags, self.tag_keys)
        self.values[tuple(sorted(tags.items()))] = value


def record_gauges(monkeypatch, metrics_module) -> dict:
    """Patch ``metrics_module.Gauge`` with RecordingGauge; returns name -> gauge, filled as
    the code under test makes gauges."""
    monkeypatch.setattr(metrics_module, "Gauge", RecordingGauge)
    RecordingGauge.made = {}
    return RecordingGauge.made
