"""Local stand-ins for a cloud cluster: moto S3 server + a Ray head on this machine.

    python -m cluster.local_stack up      # start S3 (moto) and Ray, create the bucket
    python -m cluster.local_stack down    # stop both
    python -m cluster.local_stack status

Used by `make run` (and reused by the tests' fixtures) so the demo talks to a real
HTTP S3 endpoint and a real Ray cluster, exactly as it would to AWS and `ray up`.
Credentials for moto are dummies set in the environment, as for AWS, never in config.

Authenticated like the cluster files: Ray runs with RAY_AUTH_MODE=token and the token in
~/.ray/auth_token (created 0600 on first `up`); a client without it is refused (401).
The HTTP listeners (Ray dashboard and Jobs API, moto, Prometheus) bind 127.0.0.1 only.
Ray 2.60's gRPC ports (GCS, raylet, client server) bind every interface and have no
flag to narrow them (``--node-ip-address 127.0.0.1`` is turned into this machine's IP);
they ask for the token too.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

STATE = Path(os.environ.get("RAYGEN_LOCAL_DIR", Path(__file__).resolve().parent.parent / ".local"))
S3_HOST = "127.0.0.1"
S3_PORT = int(os.environ.get("RAYGEN_S3_PORT", "9330"))
DEMO_BUCKET = "raygen-demo"
RAY_BIN = str(Path(sys.executable).with_name("ray"))  # the venv's ray CLI
RAY_TEMP = "/tmp/ray"  # Ray's default; sockets under it must stay short (108-byte limit)
RAY_SESSION_FILE = STATE / "ray.session"  # the session `up` started: `down` stops only it
LOCAL_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "raygen-local", "AWS_SECRET_ACCESS_KEY": "raygen-local",
    "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
}


def port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def set_local_aws_env() -> None:
    for key, value in LOCAL_AWS_ENV.items():
        os.environ.setdefault(key, value)


def start_s3(port: int = S3_PORT, log_dir: Path = STATE) -> subprocess.Popen | None:
    """Start moto's standalone S3 server unless one listens already; wait until ready."""
    if port_open(S3_HOST, port):
        return None
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / f"moto-{port}.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", S3_HOST, "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while not port_open(S3_HOST, port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"moto S3 server did not start; see {log_dir}/moto-{port}.log")
        time.sleep(0.2)
    (log_dir / "moto.pid").write_text(str(proc.pid))
    return proc


def create_bucket(bucket: str, port: int = S3_PORT) -> None:
    import boto3
    set_local_aws_env()
    s3 = boto3.client("s3", endpoint_url=f"http://{S3_HOST}:{port}")
    if bucket not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
        s3.create_bucket(Bucket=bucket)


PROM_SCRIPT = Path(__file__).resolve().parent / "local_prometheus.sh"
PROM_URL = "http://127.0.0.1:9090"


def start_prometheus() -> bool:
    """Local Prometheus scraping this Ray cluster, if Debian's package is installed."""
    if shutil.which("prometheus") is None:
        print("prometheus not installed: `make prometheus` (Debian package), then "
              "`cluster/local_prometheus.sh start` to see metrics on the Ray dashboard")
        return False
    return subprocess.run(["bash", str(PROM_SCRIPT), "start"]).returncode == 0


def ray_auth_env(base: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with Ray's token auth on and a token
    in place: RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH if set, else Ray's default file
    ~/.ray/auth_token, created here (256 random bits, mode 0600) when missing. Ray reads
    that file itself, so clients (drivers, `ray job submit` with RAY_AUTH_MODE=token) of
    this user find it."""
    env = dict(os.environ if base is None else base)
    env["RAY_AUTH_MODE"] = "token"
    if env.get("RAY_AUTH_TOKEN") or env.get("RAY_AUTH_TOKEN_PATH"):
        return env
    path = Path(env.get("HOME") or Path.home()) / ".ray" / "auth_token"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.stat().st_mode & 0o077 and path.stat().st_uid == os.getuid():
            path.chmod(0o600)  # Ray's own `get-auth-token --generate` leaves it 0644
    else:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
    return env


def head_args(temp_dir: str = RAY_TEMP, dashboard_port: int = 8265,
              extra: Sequence[str] = ()) -> list[str]:
    """`ray start` flags of the local head: the dashboard and its Jobs API, which runs any
    code it is sent, on loopback only."""
    return ["--head", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard_port),
            "--include-dashboard", "true", "--disable-usage-stats", "--temp-dir", temp_dir,
            *extra]


def start_head(temp_dir: str = RAY_TEMP, dashboard_port: int = 8265,
               extra: Sequence[str] = (), env: Optional[Mapping[str, str]] = None) -> None:
    """Start the head (authenticated, see the module doc); raises when `ray start` fails."""
    subprocess.run([RAY_BIN, "start", *head_args(temp_dir, dashboard_port, extra)],
                   check=True, env=ray_auth_env(env), timeout=300)


def start_ray() -> None:
    # Drivers this process starts later (gpu_smoke) send the token too.
    os.environ["RAY_AUTH_MODE"] = "token"
    if subprocess.run([RAY_BIN, "status"], capture_output=True,
                      env=ray_auth_env()).returncode == 0:
        return
    # The dashboard's Metrics tab reads from this Prometheus (started next).
    os.environ.setdefault("RAY_PROMETHEUS_HOST", PROM_URL)
    if port_open("127.0.0.1", 8265):
        raise RuntimeError("port 8265 (Ray dashboard) is taken but `ray status` finds no "
                           "cluster: another Ray instance runs here; stop it (`ray stop`) first")
    start_head()
    session = Path(RAY_TEMP, "session_latest").resolve().name
    STATE.mkdir(parents=True, exist_ok=True)
    RAY_SESSION_FILE.write_text(session)


def session_pids(session: str) -> list[int]:
    """Processes of one Ray cluster: every Ray process names its session dir in argv."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():  # not the caller itself
            try:
                if session.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def descendants(pids: list[int]) -> list[int]:
    """Every process below these (by parent pid), e.g. the engines under Ray's workers:
    they run in their own sessions and do not name Ray's session dir."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(proc.name))
    found, todo = [], list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found and child not in pids:
                found.append(child)
                todo.append(child)
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop_session(session: str, grace_s: float = 15.0) -> None:
    """Stop one Ray cluster by its session's processes, then anything still running
    below them (an engine whose guard was killed first). SIGTERM, then SIGKILL."""
    pids = session_pids(session)
    below = {pid: _started(pid) for pid in descendants(pids)}
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        _signal_all(pids, sig)
        deadline = time.monotonic() + wait_s
        while (pids := session_pids(session)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not pids:
            break
    # Engines die with their guards (parent-death signal); this covers any that did not.
    # Same pid and start time: never a process that reused a dead one's pid.
    _signal_all([p for p, t in below.items() if t is not None and _started(p) == t],
                signal.SIGKILL)


def _started(pid: int) -> str | None:
    """The process's start time (clock ticks since boot); None when gone or a zombie."""
    try:
        fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def stop_ray(grace_s: float = 15.0) -> None:
    """Stop only the Ray cluster `up` started. `ray stop` would kill every Ray instance on
    the machine (another user's job, a test suite's cluster)."""
    if not RAY_SESSION_FILE.exists():
        print("Ray was not started by local_stack: left running (`ray stop` stops it)")
        return
    stop_session(RAY_SESSION_FILE.read_text().strip(), grace_s)
    RAY_SESSION_FILE.unlink()


def stop_all() -> None:
    if PROM_SCRIPT.exists():
        subprocess.run(["bash", str(PROM_SCRIPT), "stop"], capture_output=True)
    stop_ray()
    pid_file = STATE / "moto.pid"
    if pid_file.exists():
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGTERM)
        except (ProcessLookupError, ValueError):
            pass
        pid_file.unlink()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["up", "down", "status"])
    args = parser.parse_args(argv)
    set_local_aws_env()
    if args.action == "up":
        start_s3()
        create_bucket(DEMO_BUCKET)
        start_ray()
        if start_prometheus():
            print(f"Prometheus: {PROM_URL} (raygen alert rules loaded)")
        print(f"local S3: http://{S3_HOST}:{S3_PORT} (bucket {DEMO_BUCKET}); "
              f"Ray dashboard: http://127.0.0.1:8265 (token auth: `export "
              f"RAY_AUTH_MODE=token` before `ray job submit`; the token is ~/.ray/auth_token)")
    elif args.action == "down":
        stop_all()
    else:
        print(f"S3 {'up' if port_open(S3_HOST, S3_PORT) else 'down'} on :{S3_PORT}; Ray "
              f"{'up' if port_open('127.0.0.1', 6379) else 'down'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
