"""Prefix affinity on the job's side: the prefix key (jobs/pipeline/affinity.py) and the
row sender's calls of one key each, the key sent with them (jobs/pipeline/row_sender.py).
The router that reads the key is tested in tests/unit/serve_apps/test_prefix_router.py
and, with real Serve, in tests/integration/test_prefix_affinity.py."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from jobs.pipeline.affinity import prefix_key
from jobs.pipeline.row_sender import RowSender
from jobs.pipeline.validate import canonical_json
from tests.support.virtual_time import run_virtual


def row(system: str, question: str, tools=None) -> dict:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return {"messages": canonical_json(messages),
            "tools": canonical_json(tools) if tools else None}


def test_rows_sharing_their_first_characters_share_a_key_and_others_do_not():
    long_a, long_b = "a" * 200, "b" * 200
    assert prefix_key(row(long_a, "q1"), 128) == prefix_key(row(long_a, "q2"), 128)
    assert prefix_key(row(long_a, "q1"), 128) != prefix_key(row(long_b, "q1"), 128)
    # A shared part shorter than the prefix is not grouped: the questions differ within it.
    assert prefix_key(row("short", "q1"), 128) != prefix_key(row("short", "q2"), 128)
    # Tools render first (into the system turn): rows with other tools key apart.
    tool = [{"type": "function", "function": {"name": "f"}}]
    assert prefix_key(row(long_a, "q1", tool), 128) != prefix_key(row(long_a, "q1"), 128)


def test_no_key_when_affinity_is_off():
    assert prefix_key(row("a" * 200, "q"), 0) is None


class KeyedHandle:
    """Serve's streaming-call shape; records each call's rows and its affinity keyword."""

    def __init__(self):
        self.calls: list[tuple[list[str], dict]] = []

    def options(self, stream: bool):
        return self

    @property
    def generate_many(self):
        return self

    def remote(self, requests, **kwargs):
        self.calls.append(([r.key for r in requests], kwargs))
        return self._stream(requests)

    async def _stream(self, requests):
        for r in requests:
            await asyncio.sleep(0.01)
            yield SimpleNamespace(key=r.key, request_id=r.request_id)


def test_a_call_carries_rows_of_one_key_and_names_it():
    handle = KeyedHandle()
    sender = RowSender(handle, inflight_rows=64, rows_per_call=4, linger_s=0.05)
    keys = ["A", "B", None] * 6  # interleaved, as a shuffled input sends them

    async def main():
        reqs = [SimpleNamespace(key=f"k{i}") for i in range(len(keys))]
        return await asyncio.gather(*(sender.send(r, key=k) for r, k in zip(reqs, keys)))

    results = run_virtual(main)
    assert [r.key for r in results] == [f"k{i}" for i in range(len(keys))]
    by_key: dict = {}
    for rows, kwargs in handle.calls:
        by_key.setdefault(kwargs.get("affinity"), []).extend(rows)
        assert len(rows) <= 4
        # A call without a key sends no keyword (a replica of an older raygen).
        assert kwargs == ({} if kwargs.get("affinity") is None else {"affinity": kwargs["affinity"]})
        assert {keys[int(k[1:])] for k in rows} == {kwargs.get("affinity")}
    assert {k: len(v) for k, v in by_key.items()} == {"A": 6, "B": 6, None: 6}
    # Each key filled its calls (4 + 2 rows), not one call per row.
    assert len(handle.calls) == 6


def test_a_key_with_few_rows_still_goes_after_the_linger():
    handle = KeyedHandle()
    sender = RowSender(handle, inflight_rows=8, rows_per_call=8, linger_s=0.05)

    async def main():
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.gather(sender.send(SimpleNamespace(key="x"), key="A"),
                             sender.send(SimpleNamespace(key="y"), key="B"))
        return loop.time() - start

    took = run_virtual(main)
    assert sorted(kw["affinity"] for _, kw in handle.calls) == ["A", "B"]
    assert abs(took - (0.05 + 0.01)) < 1e-6  # both keys' lingers ran side by side
