"""Observability assets for raygen: metric catalog, Grafana dashboard, alert rules.

Everything generated (dashboard JSON, Prometheus rules, Grafana alert provisioning)
is produced by ``python -m dashboards.build`` from the Python sources in this
package, so thresholds and metric names have exactly one definition.
"""

# The Grafana dashboard's uid: here, not in panels.py, so the job driver's log link
# (jobs/runs/job_metrics.py) gets it without importing the dashboard builder.
DASHBOARD_UID = "raygen-run"
