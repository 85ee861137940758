"""jobs.runs.run.Session: what the watchdog, the lease's fence and SIGTERM tell the
streaming main thread is the session's own state; its SIGTERM handler is installed only
while it streams, writes the final status first and releases the lease; a session that
ended fenced raises FencedRunError (the CLI then leaves at once). Ray, the pipeline and
progress are stand-ins."""

from __future__ import annotations

import json
import signal
import threading

import pytest

import jobs.runs.run as run
from jobs.config import parse_config
from jobs.io.run_store import RunStore
from jobs.runs.errors import FencedRunError
from jobs.runs.plans import Plan
from jobs.runs.run import Session
from tests.support.waiting import wait_until

SNAP = {"run": "r", "status": "running", "completed": 1, "total": 2, "failed": 0,
        "rejected": 0, "remaining": 1, "truncated_fraction": 0.0, "output_tokens": 5,
        "mean_output_tokens": 5, "session_rows": 1, "elapsed_s": 1.0,
        "session_output_tokens": 5}


class Stop(BaseException):
    """The session's stop exception (jobs.generate's Stopped)."""


class FakeLease:
    def __init__(self):
        self.released, self.lost, self.takeover, self.reason = False, None, None, None
        self.on_fence = None

    def fenced(self):
        return self.reason

    def release(self):
        self.released = True


class FakeProgress:
    """ProgressTracker's interface as the session uses it."""

    def __init__(self, store: RunStore):
        self.store, self.last, self.status, self.stopped = store, dict(SNAP), None, None
        self.index = type("Index", (), {"finish_counts": staticmethod(dict)})()

    def start(self):
        return self

    def fence(self):
        return None

    def update(self):
        return dict(SNAP)

    def stop(self, status):
        self.stopped = status
        return dict(SNAP, status=status)


def _session(tmp_path, monkeypatch, write) -> tuple[Session, FakeLease, RunStore]:
    cfg = parse_config({"job": {"input": "p.jsonl", "output": str(tmp_path), "run_name": "r",
                                "metrics_linger_s": 0}})
    store = RunStore.for_run(cfg.job.output, cfg.job.run_name, cfg.storage)
    store.root.fs.create_dir(store.root.path)
    lease = FakeLease()
    session = Session(cfg, store, Plan(2, expect_all=False, build=lambda: None), Stop,
                      lease=lease)
    monkeypatch.setattr(Session, "_track", lambda self: FakeProgress(store))
    monkeypatch.setattr(run.pipeline, "write", lambda *_: write(session))
    monkeypatch.setattr(run, "dashboard_url", lambda *_: None)
    monkeypatch.setattr(run, "collect_published", lambda *_: None)
    monkeypatch.setattr(run, "_report", lambda *_: ("", None))
    monkeypatch.setattr(run.index_compact, "maybe_write", lambda *_: None)
    return session, lease, store


def test_the_sessions_sigterm_handler_holds_only_while_it_streams(tmp_path, monkeypatch):
    seen = []
    session, _, _ = _session(tmp_path, monkeypatch,
                             lambda s: seen.append(signal.getsignal(signal.SIGTERM)))
    before = signal.getsignal(signal.SIGTERM)
    summary = session.run()
    assert summary.status == "succeeded"
    assert seen == [session._on_sigterm]
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_sigterm_writes_stopped_first_releases_the_lease_and_stops(tmp_path, monkeypatch):
    def write(session):
        session._on_sigterm(signal.SIGTERM, None)  # what the signal runs, in the main thread
    session, lease, _ = _session(tmp_path, monkeypatch, write)
    assert session.run().status == "stopped"  # `ray job stop`: stopped, not an error
    assert lease.released and session.progress.stopped == "stopped"
    assert json.loads((tmp_path / "r" / "progress.json").read_text())["status"] == "stopped"


def test_a_fenced_session_stops_says_why_and_raises_fenced(tmp_path, monkeypatch):
    """In a process started with SIGINT ignored too (`nohup ... &`: a fresh-clone run of
    the suite started so failed here): interrupt_main does nothing there unless the
    session gives the main thread a SIGINT handler, and the fence never lands."""
    def write(session):  # the lease's thread fences the driver while rows stream
        session.lease.reason = "lease lost"
        threading.Thread(target=session.lease.on_fence, args=("lease lost",)).start()
        wait_until(lambda: False, 10, "the fence to interrupt the main thread")
    session, lease, _ = _session(tmp_path, monkeypatch, write)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(FencedRunError) as info:
            session.run()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert info.value.fenced and session.fenced == "lease lost"
    assert str(info.value).startswith("stopped: lease lost. Rerun the same command")
    assert session.progress.stopped == "stopped"
