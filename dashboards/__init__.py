"""Observability assets for raygen: metric catalog, Grafana dashboard, alert rules.

Everything generated (dashboard JSON, Prometheus rules, Grafana alert provisioning)
is produced by ``python -m dashboards.build`` from the Python sources in this
package, so thresholds and metric names have exactly one definition.
"""
