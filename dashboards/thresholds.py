"""Alert thresholds and windows: the single definition shared by the Prometheus
rules, the Grafana-managed alerts and the threshold lines drawn on the dashboard.

Change a value here, run ``python -m dashboards.build``, commit the regenerated
files; the unit tests fail if the generated files are stale.
"""

# RaygenTruncationHigh: share of completions with finish_reason="length".
TRUNCATION_FRACTION_MAX = 0.10
TRUNCATION_WINDOW = "15m"
TRUNCATION_FOR = "10m"
# Ignore windows with too few completions: 2 truncations out of 10 is noise,
# not a regression (only matters at the very start of a run or when nearly idle).
TRUNCATION_MIN_COMPLETIONS = 50

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

# RaygenAcceptLengthDrop: short-window accept length vs the long-window average.
ACCEPT_LENGTH_DROP_RATIO = 0.7
ACCEPT_LENGTH_SHORT_WINDOW = "30m"
ACCEPT_LENGTH_LONG_WINDOW = "6h"
ACCEPT_LENGTH_FOR = "15m"

# RaygenJobDriverGone: the driver's gauges vanished while it last reported running.
# Ray drops a gauge ~2 report intervals after its process dies, so a crashed
# driver is otherwise invisible to every "while the job runs" alert above.
# The lookback is how long the alert keeps firing for an abandoned run, so it
# must outlast a night: a crash at 01:00 should still be firing at 09:00.
DRIVER_GONE_LOOKBACK = "12h"
DRIVER_GONE_FOR = "2m"
