"""``python -m bench.contract_pickle [--rows N]``: the wire cost of one row, as today's
dicts vs the typed contract (contract.protocol), through Ray's serializer.

Each object is pickled on its own (``ray.cloudpickle``, protocol 5), as a streamed
result is; a request batch is one pickle of a list (one generate_many call). Prints
µs/row (dumps + loads, fastest of ``--repeats`` alternating passes) and bytes/row side
by side. The rows are shaped like a real
one: a ~300-token prompt, a 2,000-token output, every result column set.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import asdict
from typing import Any, Callable

import ray.cloudpickle as cloudpickle

from contract.protocol import GenerateRequest, GenerateResult

CHUNK = 16  # rows per generate_many call (job.rows_per_call default)


def _request(i: int) -> GenerateRequest:
    return GenerateRequest(
        key=f"row-{i:08d}", run="bench", category="math", max_new_tokens=8192,
        sampling={"temperature": 0.6, "top_p": 0.95, "top_k": 20},
        messages=[{"role": "user", "content": "Prove that there are infinitely many primes. "
                   * 20}])


def _result(i: int, rng: random.Random) -> GenerateResult:
    output = [rng.randrange(150_000) for _ in range(2000)]
    return GenerateResult(
        key=f"row-{i:08d}", text="thinking " * 900 + "</think> answer " * 100,
        reasoning="thinking " * 900, answer="answer " * 100, finished_thinking=True,
        prompt_token_ids=[rng.randrange(150_000) for _ in range(300)],
        output_token_ids=output, finish_reason="stop", matched_stop="<|im_end|>",
        prompt_tokens=300, completion_tokens=2000, cached_tokens=128, reasoning_tokens=1800,
        max_new_tokens=8192, effective_max_new_tokens=8192, budget_clamped_by="",
        spec_verify_ct=700, accept_length=2.86, latency_s=41.5, replica="a1b2c3d4")


def _as_dict(obj: Any) -> dict[str, Any]:
    """The dict today's code sent (results also carried ``retryable``)."""
    d = asdict(obj)
    return dict(d, retryable=None) if isinstance(obj, GenerateResult) else d


def measure(objs: list, batch: bool) -> tuple[float, float]:
    """(µs per row for dumps+loads, bytes per row), one pass."""
    items = [objs[i:i + CHUNK] for i in range(0, len(objs), CHUNK)] if batch else objs
    started = time.perf_counter()
    size = 0
    for item in items:
        blob = cloudpickle.dumps(item, protocol=5)
        size += len(blob)
        cloudpickle.loads(blob)
    return (time.perf_counter() - started) / len(objs) * 1e6, size / len(objs)


def best_of(repeats: int, dicts: list, typed: list, batch: bool) -> tuple[float, ...]:
    """Alternating passes, fastest of each (the machine may be shared: noise only adds)."""
    d_us = t_us = float("inf")
    for _ in range(repeats):
        (d, d_bytes), (t, t_bytes) = measure(dicts, batch), measure(typed, batch)
        d_us, t_us = min(d_us, d), min(t_us, t)
    return d_us, t_us, d_bytes, t_bytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.contract_pickle")
    parser.add_argument("--rows", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    rng = random.Random(0)
    cases: list[tuple[str, Callable[[int], Any], bool]] = [
        ("request (16 per call)", _request, True),
        ("result, metadata only", lambda i: GenerateResult.failed(
            f"row-{i:08d}", "engine_5xx", "HTTP 503 from the engine"), False),
        ("result, 2,000-token row", lambda i: _result(i, rng), False),
    ]
    print(f"{'':26} {'dict µs/row':>12} {'typed µs/row':>13} {'dict B/row':>11} "
          f"{'typed B/row':>12}")
    for name, make, batch in cases:
        typed = [make(i) for i in range(args.rows)]
        dicts = [_as_dict(o) for o in typed]
        d_us, t_us, d_bytes, t_bytes = best_of(args.repeats, dicts, typed, batch)
        print(f"{name:26} {d_us:12.2f} {t_us:13.2f} {d_bytes:11.0f} {t_bytes:12.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
