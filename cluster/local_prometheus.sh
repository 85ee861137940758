#!/usr/bin/env bash
# Run a local Prometheus that scrapes the local Ray cluster and evaluates the
# raygen alert rules.
#
#   cluster/local_prometheus.sh [start|stop|status|restart] [--port N] [--dir DIR]
#
#   --port N   listen on 127.0.0.1:N           (env RAYGEN_PROM_PORT, default 9090)
#   --dir DIR  state folder: DIR/data (TSDB), DIR/prometheus.pid, DIR/prometheus.log
#                                              (env RAYGEN_PROM_DIR, default <repo>/.local/prometheus)
#
# Config: cluster/prometheus/prometheus.yml (10s scrape, 5s eval, Ray file-SD,
# dashboards/prometheus/raygen_rules.yml).  Point the Ray dashboard and Grafana
# at it with RAY_PROMETHEUS_HOST=http://127.0.0.1:<port> (see dashboards/README.md).
# Binds to loopback only: Prometheus has no auth, and --web.enable-lifecycle
# (POST /-/reload after editing rules) must not be reachable from elsewhere.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONFIG="$REPO/cluster/prometheus/prometheus.yml"
PORT="${RAYGEN_PROM_PORT:-9090}"
DIR="${RAYGEN_PROM_DIR:-$REPO/.local/prometheus}"
CMD="start"

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    start|stop|status|restart) CMD="$1"; shift ;;
    --port) PORT="${2:?--port needs a value}"; shift 2 ;;
    --dir) DIR="${2:?--dir needs a value}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$PORT" =~ ^[0-9]+$ ]] || { echo "--port must be a number, got '$PORT'" >&2; exit 2; }

PIDFILE="$DIR/prometheus.pid"
LOG="$DIR/prometheus.log"

# Print the pid if the pid file names a live prometheus process, else nothing.
running_pid() {
  [[ -f "$PIDFILE" ]] || return 0
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  # Check the command name too: after a reboot the pid may belong to something else.
  if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null \
      && [[ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" == prometheus* ]]; then
    echo "$pid"
  fi
}

ensure_prometheus() {
  command -v prometheus >/dev/null 2>&1 && return 0
  if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
    echo "prometheus not found; installing the Debian package (also provides promtool)..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus
    # The package's own service (0.0.0.0:9090) is not started in containers
    # (policy-rc.d); on a systemd host stop it so it does not hold our port.
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
      echo "note: the Debian prometheus service is running; stop it with 'systemctl disable --now prometheus'" >&2
    fi
  else
    cat >&2 <<EOF
prometheus is not installed. Install it (Debian/Ubuntu) with:
  sudo apt-get update && sudo apt-get install -y prometheus
or put a prometheus binary (>= 2.42: the rules use keep_firing_for) on PATH, then re-run $0.
EOF
    exit 1
  fi
}

wait_ready() {
  local pid="$1" i
  for i in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || return 1
    if command -v curl >/dev/null 2>&1; then
      curl -fsS "http://127.0.0.1:$PORT/-/ready" >/dev/null 2>&1 && return 0
    else
      # No curl: being alive after a few seconds is the best we can check.
      [[ $i -ge 5 ]] && return 0
    fi
    sleep 0.5
  done
  return 1
}

start() {
  local pid
  pid="$(running_pid)"
  if [[ -n "$pid" ]]; then
    echo "prometheus already running (pid $pid), state in $DIR"
    return 0
  fi
  ensure_prometheus
  mkdir -p "$DIR/data"
  # Fail early with a readable message instead of a crashed background process.
  promtool check config "$CONFIG" >/dev/null 2>"$DIR/check.err" || {
    cat "$DIR/check.err" >&2; echo "invalid config: $CONFIG" >&2; exit 1; }
  if [[ ! -e /tmp/ray/prom_metrics_service_discovery.json ]]; then
    echo "warning: /tmp/ray/prom_metrics_service_discovery.json does not exist yet (is Ray running?);" \
         "Prometheus will pick it up once Ray writes it." >&2
  fi
  nohup prometheus \
    --config.file="$CONFIG" \
    --storage.tsdb.path="$DIR/data" \
    --web.listen-address="127.0.0.1:$PORT" \
    --web.enable-lifecycle \
    >>"$LOG" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$PIDFILE"
  if wait_ready "$pid"; then
    echo "prometheus running: pid $pid, http://127.0.0.1:$PORT, state in $DIR"
    echo "  export RAY_PROMETHEUS_HOST=http://127.0.0.1:$PORT"
  else
    echo "prometheus failed to start; last log lines ($LOG):" >&2
    tail -n 20 "$LOG" >&2 || true
    kill "$pid" 2>/dev/null || true
    rm -f "$PIDFILE"
    exit 1
  fi
}

stop() {
  local pid i
  pid="$(running_pid)"
  if [[ -z "$pid" ]]; then
    echo "prometheus not running (no live pid in $PIDFILE)"
    rm -f "$PIDFILE"
    return 0
  fi
  kill "$pid"  # SIGTERM: Prometheus flushes the head block and exits cleanly
  for i in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$PIDFILE"; echo "prometheus stopped (pid $pid)"; return 0; }
    sleep 0.5
  done
  echo "prometheus (pid $pid) did not exit within 30s; sending SIGKILL" >&2
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$PIDFILE"
}

status() {
  local pid
  pid="$(running_pid)"
  if [[ -n "$pid" ]]; then
    echo "prometheus running: pid $pid, state in $DIR"
  else
    echo "prometheus not running"
    return 3
  fi
}

case "$CMD" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  restart) stop; start ;;
esac
