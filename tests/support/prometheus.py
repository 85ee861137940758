"""A private Prometheus scraping this test session's Ray cluster (Debian's
``prometheus``), with the repo's scrape config and rules: for the live metrics tests
(tests/integration/test_metrics_live.py on the simulator, tests/integration/sglang/
test_metrics_live.py on SGLang's real engine).

``running_prometheus(work_dir)`` starts one on a free port, pointed at the session's
file-SD list, waits until Ray's targets are scraped, and stops it afterwards.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import yaml

from dashboards import build
from serve_apps.engine_process import free_port

REPO = Path(__file__).resolve().parents[2]
REPO_PROM_CONFIG = REPO / "cluster" / "prometheus" / "prometheus.yml"
SD_FILE = "prom_metrics_service_discovery.json"
INTERVAL_S = 1  # rule evaluation interval of the test Prometheus (scrapes: the repo config's)


class PromError(AssertionError):
    pass


@dataclass
class Prom:
    url: str
    proc: subprocess.Popen
    log: Path
    started: float

    def api(self, path: str, **params: Any) -> Any:
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:  # 400/422 carry the PromQL error as JSON
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PromError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: Optional[float] = None) -> list[dict]:
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        data = self.api("query", **params)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def query_range(self, expr: str, start: float, end: float, step: float = INTERVAL_S) -> list[dict]:
        return self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}",
                        step=str(step))["result"]

    def value(self, expr: str, at: Optional[float] = None) -> Optional[float]:
        """The single value of an aggregated expression, None when it has no series."""
        result = self.query(expr, at)
        assert len(result) <= 1, f"{expr} returned {len(result)} series"
        return float(result[0]["value"][1]) if result else None


def session_dir() -> Path:
    import ray
    return Path(ray._private.worker.global_worker.node.get_session_dir_path())


def prometheus_config(sd_file: Path) -> dict:
    """cluster/prometheus/prometheus.yml, pointed at this session's file-SD list and the
    rules file by absolute path, evaluating rules every second.

    The scrape interval and timeout stay the repo's (10 s each). This test used to
    scrape every 1 s with a 1 s timeout and failed when it ran after other integration
    tests: the node's metrics page keeps every Ray Data dataset's histograms and every
    Serve deployment's series of all earlier tests in this session's cluster (5 MB,
    6-11 s to fetch on the loaded 2-core machine after test_exactly_once), so every
    scrape timed out and `up` stayed 0; alone or first, the page is small and fast.
    """
    cfg = yaml.safe_load(REPO_PROM_CONFIG.read_text())
    # The repo config must load the real rules file (its path is relative to the config).
    (rules,) = cfg["rule_files"]
    assert (REPO_PROM_CONFIG.parent / rules).resolve() == build.RULES_YML
    (job,) = cfg["scrape_configs"]
    (sd,) = job["file_sd_configs"]
    assert sd["files"] == [f"/tmp/ray/{SD_FILE}"], sd
    cfg["global"].update(evaluation_interval=f"{INTERVAL_S}s")
    cfg["rule_files"] = [str(build.RULES_YML)]
    # This session's own file, not the /tmp/ray symlink: other Ray clusters on the
    # machine (other engineers' tests) keep re-pointing that symlink at themselves.
    sd.update(files=[str(sd_file)], refresh_interval="2s")
    return cfg


def wait_for(what: str, check: Callable[[], Any], timeout_s: float, every_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    last_exc: Optional[BaseException] = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except (OSError, PromError) as exc:
            last_exc = exc
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last error: {last_exc})")


@contextlib.contextmanager
def running_prometheus(work: Path) -> Iterator[Prom]:
    """A Prometheus on this session's Ray cluster, ready and scraping Ray's targets."""
    assert subprocess.run(["which", "prometheus"], capture_output=True).returncode == 0, \
        "prometheus not on PATH (apt-get install prometheus)"
    sd_file = session_dir() / SD_FILE
    wait_for(f"Ray to write {sd_file}", sd_file.exists, 30)
    config = work / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(sd_file), sort_keys=False))
    check = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    log = work / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={work / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    prom = Prom(f"http://127.0.0.1:{port}", proc, log, time.time())
    try:
        def ready():
            assert proc.poll() is None, f"prometheus exited: {log.read_text()[-2000:]}"
            with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as resp:
                return resp.status == 200
        wait_for("prometheus to be ready", ready, 30)
        try:
            wait_for("Ray's metrics endpoints to be scraped",
                     lambda: prom.query('up{job="ray"} == 1') and prom.query("ray_node_cpu_count"), 180)
        except AssertionError as exc:  # say why: the targets' last scrape errors and durations
            targets = [(t["scrapeUrl"], t["health"], t["lastError"], t["lastScrapeDuration"])
                       for t in prom.api("targets")["activeTargets"]]
            raise AssertionError(f"{exc}; targets: {targets}; SD file: {sd_file.read_text()}") from None
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def substitute(expr: str, values: dict[str, str]) -> str:
    """A dashboard expression with its template variables filled in."""
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


def panel_targets() -> list[tuple[str, str]]:
    """(panel title [refId], PromQL) of every target of raygen's dashboard."""
    from dashboards import panels
    dashboard, _ = panels.build()
    return [(f"{p['title']} [{t['refId']}]", t["expr"])
            for p in dashboard["panels"] for t in p.get("targets", [])]
