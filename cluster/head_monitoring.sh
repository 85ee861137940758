#!/usr/bin/env bash
# Prometheus + Grafana on a `ray up` head node (cluster/ray-up-b200.yaml runs this
# right after `ray start --head`; walkthrough in cluster/monitoring.md).
#
#   cluster/head_monitoring.sh [start|stop|status] [--dir DIR]
#
#   --dir DIR  state + downloaded binaries (env RAYGEN_MONITORING_DIR, default ~/raygen-monitoring)
#
# start: Prometheus via cluster/local_prometheus.sh (127.0.0.1:9090: scrapes every
# node through Ray's file-SD list, raygen's rules, the SGLang relabel rule) and
# Grafana on 127.0.0.1:3000 with the provisioning Ray wrote at head start
# (<session>/metrics/grafana/grafana.ini: Ray's dashboards + the Prometheus
# datasource). raygen's dashboard is copied into $RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR
# (= DIR/grafana-dashboards, set for `ray start` in the yaml), the folder Ray's
# provisioning points at, so it is listed next to Ray's. Binaries not on PATH are
# downloaded once (pinned versions below; needs internet on the head), each checked
# against its recorded sha256 before it is unpacked: a download without a recorded
# checksum, or with another one, is refused and deleted (Prometheus starts even then).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${RAYGEN_MONITORING_DIR:-$HOME/raygen-monitoring}"
CMD="start"
PROMETHEUS_VERSION="2.53.4"  # >= 2.42: raygen's rules use keep_firing_for
# sha256 of prometheus-2.53.4.linux-amd64.tar.gz as published in the release's
# sha256sums.txt (the same value two independent public pins record).
PROMETHEUS_SHA256="b8b497c4610d1b93208252b60c8f20f6b2e78596ae8df43397a2e805aa53d475"
GRAFANA_VERSION="11.6.1"
# Not recorded here: it could not be verified from where this was written (no network).
# Set it where the head starts (cluster/ray-up-b200.yaml) to the value of
#   https://dl.grafana.com/oss/release/grafana-11.6.1.linux-amd64.tar.gz.sha256
# read from a machine you trust; until then Grafana is not downloaded.
GRAFANA_SHA256="${RAYGEN_GRAFANA_SHA256:-}"
RAY_GRAFANA_INI="/tmp/ray/session_latest/metrics/grafana/grafana.ini"

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    start|stop|status) CMD="$1"; shift ;;
    --dir) DIR="${2:?--dir needs a value}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done

DASHBOARDS="${RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR:-$DIR/grafana-dashboards}"
GRAFANA_HOME="$DIR/grafana-v$GRAFANA_VERSION"
GRAFANA_PID="$DIR/grafana.pid"
export PATH="$DIR/prometheus-$PROMETHEUS_VERSION.linux-amd64:$PATH"

# url sha256 dest-dir: download a release tarball to a temp file, check it against the
# recorded sha256, and only then unpack it. Never `curl | tar`: that runs on bytes
# nobody checked, and a truncated or swapped download would be half-unpacked.
fetch() {
  local url="$1" want="$2" dest="$3" tmp got
  if [[ ! "$want" =~ ^[0-9a-f]{64}$ ]]; then
    echo "refusing to download $url: no sha256 recorded for it (got '${want}');" \
         "see the comments at the top of $0" >&2
    return 1
  fi
  mkdir -p "$dest"
  tmp="$(mktemp "$dest/.download.XXXXXX")"
  if ! curl -fsSL --retry 3 -o "$tmp" "$url"; then
    rm -f "$tmp"; echo "download failed: $url" >&2; return 1
  fi
  got="$(sha256sum "$tmp" | cut -d' ' -f1)"
  if [[ "$got" != "$want" ]]; then
    rm -f "$tmp"
    echo "checksum mismatch for $url: sha256 $got, recorded $want; nothing unpacked" >&2
    return 1
  fi
  tar -xzf "$tmp" -C "$dest" --no-same-owner
  rm -f "$tmp"
}

ensure_prometheus() {
  command -v prometheus >/dev/null 2>&1 || fetch \
    "https://github.com/prometheus/prometheus/releases/download/v$PROMETHEUS_VERSION/prometheus-$PROMETHEUS_VERSION.linux-amd64.tar.gz" \
    "$PROMETHEUS_SHA256" "$DIR"
}

ensure_grafana() {
  [[ -x "$GRAFANA_HOME/bin/grafana" ]] || fetch \
    "https://dl.grafana.com/oss/release/grafana-$GRAFANA_VERSION.linux-amd64.tar.gz" \
    "$GRAFANA_SHA256" "$DIR"
}

grafana_pid() {
  [[ -f "$GRAFANA_PID" ]] || return 0
  local pid; pid="$(cat "$GRAFANA_PID")"
  if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then echo "$pid"; fi
}

start() {
  [[ -f "$RAY_GRAFANA_INI" ]] || { echo "$RAY_GRAFANA_INI missing: start Ray's head first" >&2; exit 1; }
  mkdir -p "$DIR" "$DASHBOARDS"
  cp "$REPO/dashboards/grafana/raygen.json" "$DASHBOARDS/"
  ensure_prometheus
  "$REPO/cluster/local_prometheus.sh" start --dir "$DIR/prometheus" --port 9090
  ensure_grafana
  if [[ -z "$(grafana_pid)" ]]; then
    GF_SERVER_HTTP_ADDR=127.0.0.1 GF_SERVER_HTTP_PORT=3000 GF_PATHS_DATA="$DIR/grafana-data" \
    GF_PATHS_LOGS="$DIR/grafana-logs" nohup "$GRAFANA_HOME/bin/grafana" server \
      --homepath "$GRAFANA_HOME" --config "$RAY_GRAFANA_INI" >>"$DIR/grafana.log" 2>&1 </dev/null &
    echo $! >"$GRAFANA_PID"
  fi
  for _ in $(seq 1 60); do
    curl -fsS http://127.0.0.1:3000/api/health >/dev/null 2>&1 && {
      echo "grafana running: http://127.0.0.1:3000 (dashboards from $DASHBOARDS)"; return 0; }
    sleep 1
  done
  echo "grafana did not become healthy; see $DIR/grafana.log" >&2
  exit 1
}

stop() {
  "$REPO/cluster/local_prometheus.sh" stop --dir "$DIR/prometheus"
  local pid; pid="$(grafana_pid)"
  if [[ -n "$pid" ]]; then kill "$pid"; echo "grafana stopped (pid $pid)"; fi
  rm -f "$GRAFANA_PID"
}

status() {
  "$REPO/cluster/local_prometheus.sh" status --dir "$DIR/prometheus"
  local pid; pid="$(grafana_pid)"
  if [[ -n "$pid" ]]; then echo "grafana running (pid $pid)"; else echo "grafana not running"; fi
}

# Sourced (tests/contract/cluster/test_supply_chain.py calls fetch): define only.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then "$CMD"; fi
