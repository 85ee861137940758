"""What the cluster files download and where the weights live cannot be swapped.

Read from every tracked file under cluster/ (not restated):

- nothing is made world-writable: no chmod / install -m / mkdir -m / umask / os.chmod
  that gives "others" write (the ray-up model cache was chmod 777: any local process
  could swap the weights or the tokenizer every replica loads); the cache on `ray up`
  nodes is root's (Ray runs as root in the container) and 0755;
- every download from outside this machine goes through head_monitoring.sh's ``fetch``,
  with a sha256 recorded in the file or passed in by the operator, never ``curl | tar``
  or another pipe; pip installs are exact ``==`` pins; the image's base is pinned by
  digest. ``fetch`` itself runs here against a local HTTP server: the right checksum
  unpacks, a wrong one unpacks nothing and leaves no file, a missing one downloads
  nothing.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import re
import subprocess
import tarfile
import threading
from pathlib import Path
from typing import Iterator

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CLUSTER = REPO / "cluster"
HEAD_MONITORING = CLUSTER / "head_monitoring.sh"
LOOPBACK = re.compile(r"^https?://(127\.0\.0\.1|localhost|\[::1\])([:/]|$)")


def cluster_files() -> list[Path]:
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "cluster"],
                             capture_output=True, text=True, check=True).stdout.split()
    untracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "--others",
                                "--exclude-standard", "cluster"],
                               capture_output=True, text=True, check=True).stdout.split()
    return sorted(REPO / p for p in {*tracked, *untracked} if (REPO / p).is_file())


def _code_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of what runs: comments dropped, except in the docs, whose
    shell blocks are what users run."""
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if path.suffix == ".md":
            yield n, line
            continue
        code = line.split(" #")[0] if path.suffix != ".py" else line.split("  #")[0]
        if code.lstrip().startswith("#"):
            continue
        yield n, code


# --- world-writable -----------------------------------------------------------------------

def _gives_others_write(mode: str) -> bool:
    if re.fullmatch(r"[0-7]{3,4}", mode):
        return bool(int(mode[-1]) & 2)
    # symbolic: any clause that adds or sets w for o, a, or everyone (no "who")
    for clause in mode.split(","):
        m = re.fullmatch(r"([ugoa]*)([-+=])([rwxXst]*)", clause)
        if m and m.group(2) in "+=" and "w" in m.group(3) and (
                not m.group(1) or set(m.group(1)) & {"o", "a"}):
            return True
    return False


def world_writable(text: str) -> list[str]:
    """Each command in ``text`` that leaves something writable by every local user."""
    found = []
    for m in re.finditer(r"\bchmod\s+(?:-\w+\s+)*([0-7]{3,4}|[ugoa]*[-+=][rwxXst,ugoa+=-]*)",
                         text):
        if _gives_others_write(m.group(1)):
            found.append(m.group(0))
    for m in re.finditer(r"\b(?:install|mkdir)\b[^\n;&|]*?\s-m\s*([0-7]{3,4}|\S+)", text):
        if _gives_others_write(m.group(1)):
            found.append(m.group(0))
    for m in re.finditer(r"\bumask\s+([0-7]{3,4})", text):
        if not int(m.group(1)[-1]) & 2:
            found.append(m.group(0))
    for m in re.finditer(r"os\.(?:f?chmod|makedirs|mkdir)\([^)]*?0o([0-7]{3,4})", text):
        if int(m.group(1)[-1]) & 2:
            found.append(m.group(0))
    return found


def test_the_checker_finds_world_writable_modes():
    for bad in ["sudo chmod 777 /opt/dlami/nvme/hf", "chmod -R 0777 x", "chmod 1777 /cache",
                "chmod a+w x", "chmod o+rwx x", "chmod +w x", "chmod u+x,o=rw x",
                "install -d -m 0777 /x", "mkdir -p -m 777 /x", "umask 000",
                "os.chmod(path, 0o666)", "os.makedirs(d, 0o777)"]:
        assert world_writable(bad), bad
    for good in ["chmod 0755 /x", "chmod 600 ~/.ray/auth_token", "chmod o-w /opt/dlami/nvme",
                 "chmod go-w x", "chmod +x run.sh", "chmod u+rw x", "install -d -m 0755 /x",
                 "umask 077", "umask 022", "os.chmod(path, 0o600)"]:
        assert not world_writable(good), good


def test_nothing_in_cluster_is_made_world_writable():
    problems = [f"{p.relative_to(REPO)}:{n}: {hit}" for p in cluster_files()
                for n, line in _code_lines(p) for hit in world_writable(line)]
    assert not problems, "world-writable:\n" + "\n".join(problems)


def test_the_ray_up_model_cache_belongs_to_root_and_is_0755():
    doc = yaml.safe_load((CLUSTER / "ray-up-b200.yaml").read_text())
    commands = " && ".join(doc["initialization_commands"])
    cache = "/opt/dlami/nvme/hf"
    assert re.search(rf"chown root:root {cache}\b", commands), commands
    assert re.search(rf"chmod 0?755 {cache}\b", commands), commands
    # The parent is what the container mounts: a rename there would swap the folder.
    assert re.search(r"chmod [ug]*o-w /opt/dlami/nvme\b", commands), commands
    assert any("/opt/dlami/nvme:/mnt/nvme" in o for o in doc["docker"]["run_options"])


# --- downloads ----------------------------------------------------------------------------

def _fetch_body(text: str) -> tuple[int, int]:
    start = text.index("fetch() {") if "fetch() {" in text else text.index("\nfetch() {")
    return start, text.index("\n}\n", start)


def fetch_calls(code: str) -> list[str]:
    """The argument text of each call of fetch (not its definition), continuations joined."""
    return [m.group(1) for m in
            re.finditer(r"\bfetch\b(?!\s*\()((?:[^\n]*\\\n)*[^\n]*)", code)]


def download_problems(path: Path) -> list[str]:
    """Downloads in one file that are not pinned: a curl/wget outside ``fetch`` to another
    machine, any curl/wget piped into a command, a ``fetch`` whose checksum is neither a
    recorded sha256 nor the operator's ${RAYGEN_...:-} (which fetch checks at run time)."""
    text = path.read_text()
    code = "\n".join(line for _, line in _code_lines(path))
    problems = []
    for m in re.finditer(r"\b(curl|wget)\b[^\n;&]*", code):
        command = m.group(0)
        if re.search(r"\|(?!\|)", command):
            problems.append(f"piped download: {command.strip()}")
    fetch_span = _fetch_body(code) if path == HEAD_MONITORING else (0, 0)
    for m in re.finditer(r"\b(curl|wget)\b([^\n;&|]*)", code):
        if fetch_span[0] <= m.start() < fetch_span[1]:
            continue
        urls = re.findall(r"""["']?((?:https?|ftp)://[^\s"']+|\$\{?\w+\}?)""", m.group(2))
        for url in urls:
            if not LOOPBACK.match(url):
                problems.append(f"download outside fetch (no checksum): {m.group(0).strip()}")
    if path.name == "Dockerfile":
        for line in code.splitlines():
            if re.match(r"\s*ADD\s+\S*https?://", line):
                problems.append(f"ADD from a URL: {line.strip()}")
            if re.match(r"\s*FROM\s", line) and "@" not in line:
                problems.append(f"base image not pinned by digest: {line.strip()}")
    for call in fetch_calls(code):
        args = re.findall(r'"([^"]*)"', call)
        sha = next((a for a in args if a.startswith("$")), None)
        if sha is None:
            problems.append(f"fetch without a checksum: {call.strip()}")
            continue
        var = sha.strip("${}")
        assigned = re.search(rf'(?m)^{var}="([^"]*)"', text)
        value = assigned.group(1) if assigned else None
        if value is None or not (re.fullmatch(r"[0-9a-f]{64}", value)
                                 or re.fullmatch(r"\$\{RAYGEN_\w+:-\}", value)):
            problems.append(f"{var} is not a recorded sha256 ({value!r})")
    for name, items in re.findall(r"(?s)\b(\w+_PINS)=\((.*?)\)", code):
        loose = [i for i in items.split() if "==" not in i]
        if loose:
            problems.append(f"{name}: not exact pins: {loose}")
    for spec in re.findall(r'(\w+_SPEC)="\$\{\w+:-([^}]*)\}"', code):
        if "==" not in spec[1]:
            problems.append(f"{spec[0]} default is not an exact pin: {spec[1]}")
    return problems


def test_the_checker_finds_unpinned_downloads(tmp_path):
    bad = tmp_path / "x.sh"
    bad.write_text('curl -fsSL "https://example.com/a.tar.gz" | tar -xz -C /opt\n'
                   'wget -O /tmp/b https://example.com/b\n'
                   'PINS_SHA=""\n'
                   'SGLANG_PINS=(sglang==0.5.23 torch)\n')
    problems = download_problems(bad)
    assert any("piped download" in p for p in problems)
    assert sum("download outside fetch" in p for p in problems) == 2
    assert any("not exact pins: ['torch']" in p for p in problems)
    good = tmp_path / "y.sh"
    good.write_text('curl -fsS http://127.0.0.1:3000/api/health >/dev/null\n')
    assert download_problems(good) == []


def test_every_download_in_cluster_is_pinned_and_verified():
    problems = [f"{p.relative_to(REPO)}: {problem}" for p in cluster_files()
                if p.suffix in (".sh", ".yaml", ".yml", ".py", ".md", "") and p.name != "README.md"
                for problem in download_problems(p)]
    assert not problems, "\n".join(problems)
    # The scan did read the downloads: both tarballs go through fetch, each with its sha.
    code = "\n".join(line for _, line in _code_lines(HEAD_MONITORING))
    calls = fetch_calls(code)
    assert len(calls) == 2, calls
    assert ['"$PROMETHEUS_SHA256"' in calls[0], '"$GRAFANA_SHA256"' in calls[1]] == [True, True]


def test_the_ray_up_head_passes_the_grafana_checksum_to_head_monitoring():
    doc = yaml.safe_load((CLUSTER / "ray-up-b200.yaml").read_text())
    (start,) = [c for c in doc["head_start_ray_commands"] if "head_monitoring.sh start" in c]
    assert "RAYGEN_GRAFANA_SHA256=" in start


# --- fetch, for real ----------------------------------------------------------------------

@pytest.fixture
def server(tmp_path):
    """A local HTTP server over tmp_path/www, counting the requests it answers."""
    www = tmp_path / "www"
    www.mkdir()
    hits: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(www), **kwargs)

        def do_GET(self):
            hits.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield www, f"http://127.0.0.1:{httpd.server_address[1]}", hits
    finally:
        httpd.shutdown()
        httpd.server_close()


def _tarball(path: Path) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"#!/bin/sh\necho prometheus\n"
        info = tarfile.TarInfo("prometheus-2.53.4.linux-amd64/prometheus")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()


def _fetch(url: str, sha: str, dest: Path) -> subprocess.CompletedProcess:
    # `set --` first: a sourced script sees the caller's arguments as its own.
    script = f'url=$1 sha=$2 dest=$3; set --; source "{HEAD_MONITORING}"; fetch "$url" "$sha" "$dest"'
    return subprocess.run(["bash", "-c", script, "fetch", url, sha, str(dest)],
                          capture_output=True, text=True, timeout=60)


def test_fetch_unpacks_only_what_matches_its_sha256(server, tmp_path):
    www, base, hits = server
    sha = _tarball(www / "p.tar.gz")
    dest = tmp_path / "dest"

    wrong = _fetch(f"{base}/p.tar.gz", "0" * 64, dest)
    assert wrong.returncode != 0 and "checksum mismatch" in wrong.stderr, wrong.stderr
    assert list(dest.iterdir()) == []  # nothing unpacked, no temp file left
    assert hits == ["/p.tar.gz"]

    ok = _fetch(f"{base}/p.tar.gz", sha, dest)
    assert ok.returncode == 0, ok.stderr
    assert (dest / "prometheus-2.53.4.linux-amd64" / "prometheus").is_file()
    assert [p.name for p in dest.iterdir()] == ["prometheus-2.53.4.linux-amd64"]


@pytest.mark.parametrize("sha", ["", "YOUR_GRAFANA_11_6_1_LINUX_AMD64_SHA256", "abc"])
def test_fetch_without_a_recorded_sha256_downloads_nothing(server, tmp_path, sha):
    www, base, hits = server
    _tarball(www / "g.tar.gz")
    refused = _fetch(f"{base}/g.tar.gz", sha, tmp_path / "dest")
    assert refused.returncode != 0 and "refusing to download" in refused.stderr
    assert hits == [] and not (tmp_path / "dest").exists()
