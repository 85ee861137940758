"""What salting the row-key digests costs: time per key and bytes per key, side by side.

    python -m bench.key_digests [--keys 1000000]

Hashes the same keys (shaped like the run's own: ``sha256:`` + 32 hex) four ways in one
run, alternating passes (the fastest of --passes is printed, this machine is noisy):
raygen's digest before salts (blake2b, 8 bytes, read as an int per key), the same
salted (blake2b's salt parameter), raygen's now (salted, the digests' bytes joined and
read at once), a keyed blake2b (its key is a whole extra block per key) and 16-byte
digests.
Then the run index's and the admission pass's bytes per key for 8- and 16-byte digests
at 10M keys, from their own dtypes (jobs/io/run_index.py COLUMNS; admission's
held-key arrays and table).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import numpy as np

from jobs.io.digests import digests_of, new_salt
from jobs.io.run_index import COLUMNS

MILLION = 10_000_000


def _time(fn, keys: list[str]) -> float:
    started = time.perf_counter()
    fn(keys)
    return (time.perf_counter() - started) / len(keys) * 1e9


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args(argv)
    keys = [f"sha256:{os.urandom(16).hex()}" for _ in range(args.keys)]
    salt = new_salt()
    def per_int(ks, **kw):  # how digests_of read them before: an int per key
        return np.fromiter((int.from_bytes(hashlib.blake2b(k.encode(), digest_size=8, **kw)
                                           .digest(), "little") for k in ks), np.uint64)
    ways = {
        "before: unsalted, an int per key": lambda ks: per_int(ks),
        "salted, an int per key": lambda ks: per_int(ks, salt=salt),
        "now: salted, bytes joined (digests_of)": lambda ks: digests_of(ks, salt),
        "keyed blake2b-8, an int per key": lambda ks: per_int(ks, key=salt),
        "blake2b-16, bytes joined": lambda ks: np.frombuffer(b"".join(hashlib.blake2b(
            k.encode(), digest_size=16).digest() for k in ks), np.uint64),
    }
    best = {name: float("inf") for name in ways}
    for _ in range(args.passes):
        for name, fn in ways.items():
            best[name] = min(best[name], _time(fn, keys))
    base = best["before: unsalted, an int per key"]
    print(f"# key digests: {args.keys:,} keys, fastest of {args.passes} alternating passes")
    print("| digest | ns/key | × before |\n|---|---|---|")
    for name, ns in best.items():
        print(f"| {name} | {ns:.0f} | {ns / base:.2f} |")
    index8 = sum(np.dtype(t).itemsize for t in COLUMNS.values())
    index16 = index8 + 16  # the key digest and the prompt digest each 8 bytes wider
    admission8 = 8 + 4 + 8 + 8  # held keys: first ordinal, count; table: digest, ordinal
    admission16 = admission8 + 8 + 8  # ... with the done and table digests 16 bytes
    print("\n| at 10M keys | 8-byte digests | 16-byte digests |\n|---|---|---|")
    print(f"| run index, B/key | {index8} | {index16} |")
    print(f"| run index, MB | {index8 * MILLION / 1e6:.0f} | {index16 * MILLION / 1e6:.0f} |")
    print(f"| admission pass (held keys + table), MB | {admission8 * MILLION / 1e6:.0f} | "
          f"{admission16 * MILLION / 1e6:.0f} |")


if __name__ == "__main__":
    main()
