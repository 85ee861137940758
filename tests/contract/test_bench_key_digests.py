"""`python -m bench.key_digests` in a fresh interpreter: every way's figure is printed,
and the memory table matches the run index's own dtypes. No timing checks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from jobs.io.run_index import COLUMNS

REPO = Path(__file__).resolve().parents[2]


def test_bench_prints_each_digest_and_the_memory_at_10m_keys():
    done = subprocess.run([sys.executable, "-m", "bench.key_digests", "--keys", "2000",
                           "--passes", "1"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    rows = dict(re.findall(r"^\| (.+?) \| (\d+) \| \d+\.\d+ \|$", done.stdout, re.M))
    assert set(rows) == {"before: unsalted, an int per key", "salted, an int per key",
                         "now: salted, bytes joined (digests_of)",
                         "keyed blake2b-8, an int per key", "blake2b-16, bytes joined"}, \
        done.stdout
    per_key = sum(COLUMNS[c]().itemsize for c in COLUMNS)
    assert f"| run index, B/key | {per_key} | {per_key + 16} |" in done.stdout
