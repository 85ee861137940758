"""Local output on a disk that fills mid-run (a real 256 KiB tmpfs, mounted by the test:
root in a sandbox, as CI runs): the session ends at the first failed write with the real
error naming the file, not a retry storm or a wrapped traceback; no temp file is left;
progress.json says "failed" and why; once space is freed the same command resumes and the
run completes exactly."""

from __future__ import annotations

import subprocess

import pytest

from jobs.runs.run import RunError
from tests.integration.helpers import assert_run_exact, run, run_config, store_of, write_prompts

pytestmark = [pytest.mark.integration]

ROWS = 400


def _mount(mount, size: str, *options: str) -> None:
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([*options, f"size={size}"]),
                           "tmpfs", str(mount)], capture_output=True, text=True)
    assert done.returncode == 0, f"this test mounts a small tmpfs (needs root): {done.stderr}"


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    _mount(mount, "256k")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_local_disk_ends_the_session_with_the_real_error(ray_cluster, s3_endpoint,
                                                                 tmp_path, small_disk):
    rows = write_prompts(tmp_path / "p.jsonl", ROWS)
    tree = run_config(tmp_path, s3_endpoint, rows_file=str(rows), output=str(small_disk),
                      job={"rows_per_file": 16, "batch_size": 8})
    with pytest.raises(RunError) as info:
        run(tree)
    message = str(info.value).split("\n")[0]
    print(f"\nfull disk: {message}")
    assert message.startswith("output storage is full: [Errno 28] No space left on device: "
                              f"'{small_disk}/"), message
    assert "rerun the same command to resume" in message
    assert not [p for p in small_disk.rglob("*") if ".tmp-" in p.name], "temp files left"
    progress = store_of(tree).read_json("progress.json")
    assert progress["status"] == "failed"
    assert 0 < progress["completed"] < ROWS

    _mount(small_disk, "64m", "remount")  # the operator frees space
    assert run(tree).status == "succeeded"
    assert_run_exact(tree, [f"p{i:05d}" for i in range(ROWS)])
