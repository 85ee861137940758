"""The engines' own view: scrape each engine's /metrics over the run.

``EngineWatch`` polls every engine's ``sglang:generation_tokens_total`` (and reads
``sglang:sim_capacity_tok_s``) every ``period_s`` in a background thread, so any
window's engine-side output rate can be read afterwards by interpolating the
counters at the window's edges. The engines are scraped side by side: serially, at 32
replicas on 2 cores, one engine slow to answer held up the others' scrapes until the
sample timed out and the steady rate was lost. The threads' own CPU time is reported so
the benchmark can subtract it from the driver's.
"""

from __future__ import annotations

import bisect
import threading
import time
from concurrent.futures import ThreadPoolExecutor
import urllib.request
from typing import Optional

from jobs.tune.measure import metric_sums

GEN = "sglang:generation_tokens"  # the parser strips _total from counter families
CAPACITY = "sglang:sim_capacity_tok_s"
REQUESTS = "sglang:num_requests"
RUNNING = "sglang:num_running_reqs"
QUEUED = "sglang:num_queue_reqs"
RETRACTED = "sglang:num_retracted_requests_total"  # written from the first retraction on


def scrape(url: str, timeout_s: float = 5.0) -> dict[str, float]:
    """The engine's /metrics, each sample summed over its labels (what `raygen tune`
    reads too: jobs/tune/measure.metric_sums)."""
    with urllib.request.urlopen(url + "/metrics", timeout=timeout_s) as resp:
        return metric_sums(resp.read().decode())


def generation_tokens(url: str) -> float:
    return scrape(url)[GEN + "_total"]


def capacity_tok_s(urls: list[str]) -> float:
    return sum(scrape(u)[CAPACITY] for u in urls)


class EngineWatch:
    """Time series of the summed engine generation-token counter."""

    def __init__(self, urls: list[str], period_s: float = 0.5):
        self.urls, self.period_s = urls, period_s
        self.times: list[float] = []
        self.tokens: list[float] = []
        self.running: list[list[float]] = []  # per scrape, per engine
        self.queued: list[list[float]] = []
        self.retracted: list[float] = []  # per scrape, summed over the engines
        self.thread_cpu_s = 0.0  # the watch's threads: the loop's and the scrapers'
        self.failed_scrapes = 0
        self._scrape_cpu_s = 0.0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(16, len(urls))),
                                        thread_name_prefix="bench-scrape")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="bench-engines")

    def _scrape(self, url: str) -> dict[str, float]:
        cpu0 = time.thread_time()
        try:
            return scrape(url)
        finally:
            with self._lock:
                self._scrape_cpu_s += time.thread_time() - cpu0

    def sample(self) -> None:
        scraped = list(self._pool.map(self._scrape, self.urls))
        self.times.append(time.time())
        self.tokens.append(sum(m[GEN + "_total"] for m in scraped))
        self.running.append([m.get(RUNNING, 0.0) for m in scraped])
        self.queued.append([m.get(QUEUED, 0.0) for m in scraped])
        self.retracted.append(sum(m.get(RETRACTED, 0.0) for m in scraped))

    def trustworthy(self) -> bool:
        """Whether rates over the series mean anything: no engine's counters went back (a
        replaced engine counts from 0 again) and at most one scrape in ten failed (a
        replaced engine's old URL fails every scrape after it). One scrape unanswered in
        5 s only coarsens the series: a loaded fresh-clone run lost its steady tok/s to
        one such scrape when any failure voided it."""
        reset = any(b < a for a, b in zip(self.tokens, self.tokens[1:]))
        return not reset and self.failed_scrapes <= 0.1 * (len(self.tokens) + self.failed_scrapes)

    def retractions(self) -> Optional[float]:
        """Requests the engines retracted between the first scrape and the last."""
        return self.retracted[-1] - self.retracted[0] if self.retracted else None

    def batch_stats(self, t0: float, t1: float, full_batch: float) -> Optional[dict]:
        """Running/queued requests per engine over [t0, t1], from the scrapes in it."""
        rows = [(r, q) for t, r, q in zip(self.times, self.running, self.queued) if t0 <= t <= t1]
        if not rows:
            return None
        running = [x for r, _ in rows for x in r]
        queued = [x for _, q in rows for x in q]
        return {"mean_running": sum(running) / len(running), "min_running": min(running),
                "mean_queued": sum(queued) / len(queued),
                "below_full_batch": sum(x < full_batch for x in running) / len(running)}

    def _loop(self) -> None:
        cpu0 = time.thread_time()
        while True:
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a missed scrape only coarsens the series
                self.failed_scrapes += 1
            self.thread_cpu_s = time.thread_time() - cpu0 + self._scrape_cpu_s
            if self._stop.wait(self.period_s):
                return

    def start(self) -> "EngineWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=10)
        try:
            self.sample()
        except Exception:  # noqa: BLE001 - an engine gone at the end is reported by the caller
            pass
        finally:
            self._pool.shutdown(wait=False)

    def tokens_at(self, t: float) -> Optional[float]:
        """The summed counter at wall time t, linear between scrapes."""
        ts, ks = self.times, self.tokens
        if not ts or t < ts[0] or t > ts[-1]:
            return None
        i = bisect.bisect_left(ts, t)
        if ts[i] == t or i == 0:
            return ks[i]
        t0, t1, k0, k1 = ts[i - 1], ts[i], ks[i - 1], ks[i]
        return k0 + (k1 - k0) * (t - t0) / (t1 - t0)

    def first_time_at(self, rate_tok_s: float) -> Optional[float]:
        """First scrape time at which the rate since the previous scrape reached rate_tok_s."""
        for (t0, k0), (t1, k1) in zip(zip(self.times, self.tokens),
                                      zip(self.times[1:], self.tokens[1:])):
            if t1 > t0 and (k1 - k0) / (t1 - t0) >= rate_tok_s:
                return t1
        return None

    def rate(self, t0: float, t1: float) -> Optional[float]:
        a, b = self.tokens_at(t0), self.tokens_at(t1)
        if a is None or b is None or t1 <= t0:
            return None
        return (b - a) / (t1 - t0)

