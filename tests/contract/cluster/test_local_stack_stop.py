"""cluster.local_stack down stops only the Ray cluster `up` started, never another one."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cluster import local_stack


def _fake_ray_process(session: str) -> subprocess.Popen:
    # Ray processes carry their session dir in argv, as this sleeper does.
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             f"--session-dir=/tmp/ray/{session}"])


@pytest.fixture
def session_file(tmp_path, monkeypatch):
    path = tmp_path / "ray.session"
    monkeypatch.setattr(local_stack, "RAY_SESSION_FILE", path)
    return path


def test_down_kills_its_own_session_and_spares_another(session_file):
    ours = _fake_ray_process("session_raygen_test_ours")
    other = _fake_ray_process("session_raygen_test_other")
    try:
        session_file.write_text("session_raygen_test_ours")
        local_stack.stop_ray(grace_s=5)
        assert ours.wait(timeout=5) is not None
        assert other.poll() is None, "another cluster's process was killed"
        assert not session_file.exists()
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()


def test_down_without_session_file_leaves_ray_alone(session_file, capsys):
    other = _fake_ray_process("session_raygen_test_unrelated")
    try:
        local_stack.stop_ray(grace_s=1)
        assert other.poll() is None
        assert "not started by local_stack" in capsys.readouterr().out
    finally:
        other.kill()
        other.wait()
