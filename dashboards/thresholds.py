"""Alert thresholds and windows: the single definition shared by the Prometheus
rules, the Grafana-managed alerts and the threshold lines drawn on the dashboard.

Change a value here, run ``python -m dashboards.build``, commit the regenerated
files; the unit tests fail if the generated files are stale.
"""

# RaygenTruncationHigh: the run's written truncated rows / written rows, against the
# run's own threshold (job.truncation_alert_ratio, default in jobs/config.py, exported
# as a gauge that the rule and the dashboard's threshold line both read).
# Cumulative over the run's durable output, so it crosses the threshold once and
# stays there (a run's budget cannot change mid-run): one warning per run, no flapping.
TRUNCATION_WINDOW = "15m"  # the dashboard panel's rolling window
TRUNCATION_FOR = "10m"
# Hold the alert this long after the fraction dips under the threshold, so a run
# hovering around it does not fire/resolve/fire again.
TRUNCATION_KEEP_FIRING_FOR = "1h"
# Ignore runs with too few written rows: 2 truncations out of 10 is noise.
TRUNCATION_MIN_ROWS = 50

# RaygenThroughputDrop: short-window output tok/s vs the long-window average.
THROUGHPUT_DROP_RATIO = 0.5
THROUGHPUT_SHORT_WINDOW = "10m"
THROUGHPUT_LONG_WINDOW = "1h"
THROUGHPUT_FOR = "5m"

# RaygenFailureRateHigh: failures / (completions + failures).
FAILURE_RATIO_MAX = 0.05
FAILURE_WINDOW = "10m"
FAILURE_FOR = "5m"

# RaygenRunStalled: seconds since the newest durable write while the driver runs.
STALL_SECONDS = 15 * 60
STALL_FOR = "1m"

# RaygenEngineDown: engine_up == 0, or no replica metrics while the job runs.
ENGINE_DOWN_FOR = "2m"

# RaygenReplicasBelowExpected: healthy replicas / the run's expected replicas
# (serve.autoscaling.min_replicas) while its driver runs. Serve replaces a failed
# replica within minutes; longer means lost capacity (node gone, no GPU free).
REPLICAS_BELOW_FOR = "10m"

# RaygenAcceptLengthDrop: short-window accept length vs the long-window average.
ACCEPT_LENGTH_DROP_RATIO = 0.7
ACCEPT_LENGTH_SHORT_WINDOW = "30m"
ACCEPT_LENGTH_LONG_WINDOW = "6h"
ACCEPT_LENGTH_FOR = "15m"

# RaygenReplicaAcceptLengthLow: one replica's accept length vs the rest of its fleet
# (same model and run) over the same window, e.g. its draft model or speculative config
# did not load after a restart. Both sides need this many verify steps in the window, so
# a replica that served a few hard prompts does not page.
REPLICA_ACCEPT_LENGTH_RATIO = 0.7
REPLICA_ACCEPT_LENGTH_WINDOW = ACCEPT_LENGTH_SHORT_WINDOW
REPLICA_ACCEPT_LENGTH_MIN_STEPS = 10_000
REPLICA_ACCEPT_LENGTH_FOR = "15m"

# RaygenReplicaOutputsFlagged: one replica's flagged rate (integrity flags per row it
# produced, contract/integrity.py) over the window, above the larger of an absolute
# floor and a multiple of the rest of its fleet's rate (same model and run). A lone
# replica (no rest of fleet) is held to the floor alone. At least MIN_ROWS of the
# replica's rows checked in the window, so 2 flagged rows out of 3 do not page.
REPLICA_FLAGGED_WINDOW = "15m"
REPLICA_FLAGGED_RATIO_MIN = 0.05
REPLICA_FLAGGED_FLEET_MULTIPLE = 3
REPLICA_FLAGGED_MIN_ROWS = 50
REPLICA_FLAGGED_FOR = "5m"

# RaygenJobDriverGone: the driver's gauges vanished while it last reported running.
# Ray drops a gauge ~2 report intervals after its process dies, so a crashed
# driver is otherwise invisible to every "while the job runs" alert above.
# The lookback is how long the alert keeps firing for an abandoned run, so it
# must outlast a night: a crash at 01:00 should still be firing at 09:00.
DRIVER_GONE_LOOKBACK = "12h"
DRIVER_GONE_FOR = "2m"
