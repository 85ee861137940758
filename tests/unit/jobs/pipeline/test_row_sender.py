"""jobs.pipeline.row_sender: rows share handle calls, slots stay per row, errors reach every row.

The handle here is an in-process stand-in with Serve's streaming-call shape
(``handle.options(stream=True).generate_many.remote(requests)`` is an async iterator);
tests/integration drives the real one.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from contract.protocol import GenerateResult
from jobs.config import BreakerConfig, RetryConfig
from jobs.pipeline.retry import CallIncomplete
from jobs.pipeline.row_sender import RowSender
from tests.support.virtual_time import run_virtual
from jobs.pipeline.settings import StageSettings


class StreamingHandle:
    """Answers each row after ``delay[key]`` seconds (default 0.01), in completion order."""

    def __init__(self, delay=None, fail_after=None, drop=()):
        self.delay = delay or {}
        self.fail_after = fail_after  # raise after this many results of a call
        self.drop = set(drop)         # keys the stream never answers
        self.calls: list[list[str]] = []
        self.inflight = self.max_inflight = 0

    def options(self, stream: bool):
        assert stream is True
        return self

    @property
    def generate_many(self):
        return self

    def remote(self, requests):
        self.calls.append([r.key for r in requests])
        return self._stream(requests)

    async def _stream(self, requests):
        self.inflight += len(requests)
        self.max_inflight = max(self.max_inflight, self.inflight)
        pending = [asyncio.ensure_future(self._one(r)) for r in requests]
        try:
            for n, done in enumerate(asyncio.as_completed(pending)):
                if self.fail_after is not None and n == self.fail_after:
                    raise ConnectionError("replica died")
                result = await done
                if result.key not in self.drop:
                    yield result
        finally:
            self.inflight -= len(requests)
            for task in pending:
                task.cancel()

    async def _one(self, request):
        await asyncio.sleep(self.delay.get(request.key, 0.01))
        return SimpleNamespace(key=request.key, echo=request.n)


def requests(n):
    return [SimpleNamespace(key=f"k{i}", n=i) for i in range(n)]


def test_rows_ready_together_share_calls_and_each_gets_its_own_result():
    handle = StreamingHandle()
    sender = RowSender(handle, inflight_rows=64, rows_per_call=16, linger_s=0.05)

    async def main():
        return await asyncio.gather(*(sender.send(r) for r in requests(40)))

    results = run_virtual(main)
    assert [r.echo for r in results] == list(range(40))
    assert sorted(k for call in handle.calls for k in call) == sorted(f"k{i}" for i in range(40))
    assert max(len(c) for c in handle.calls) == 16 and len(handle.calls) <= 4


def test_rows_per_call_one_sends_each_row_alone():
    handle = StreamingHandle()
    sender = RowSender(handle, inflight_rows=8, rows_per_call=1, linger_s=0.05)

    async def main():
        return await asyncio.gather(*(sender.send(r) for r in requests(10)))

    run_virtual(main)
    assert len(handle.calls) == 10 and all(len(c) == 1 for c in handle.calls)


def test_in_flight_never_exceeds_the_slots():
    handle = StreamingHandle(delay={f"k{i}": 0.2 for i in range(30)})
    sender = RowSender(handle, inflight_rows=5, rows_per_call=4, linger_s=0.05)

    async def main():
        await asyncio.gather(*(sender.send(r) for r in requests(30)))

    run_virtual(main)
    assert handle.max_inflight == 5


def test_a_slow_row_holds_one_slot_not_its_chunk():
    # 4 slots; k0 takes 1 s. Its chunk-mates finish at once, and the 8 rows behind them
    # must run on the 3 freed slots long before k0 ends.
    handle = StreamingHandle(delay={"k0": 1.0})
    sender = RowSender(handle, inflight_rows=4, rows_per_call=4, linger_s=0.05)
    finished: dict[str, float] = {}

    async def main():
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def one(r):
            await sender.send(r)
            finished[r.key] = loop.time() - start

        await asyncio.gather(*(one(r) for r in requests(12)))

    run_virtual(main)
    assert handle.calls[0] == ["k0", "k1", "k2", "k3"]
    assert finished["k0"] == pytest.approx(1.0, abs=0.02)  # its own 1 s (plus the linger)
    assert max(t for k, t in finished.items() if k != "k0") < 0.5


def test_a_call_that_fails_midway_fails_only_its_unanswered_rows_and_frees_their_slots():
    handle = StreamingHandle(delay={"k0": 0.01, "k1": 0.2, "k2": 0.2}, fail_after=1)
    sender = RowSender(handle, inflight_rows=3, rows_per_call=3, linger_s=0.05)

    async def main():
        first = await asyncio.gather(*(sender.send(r) for r in requests(3)),
                                     return_exceptions=True)
        handle.fail_after = None
        after = await asyncio.gather(*(sender.send(r) for r in requests(3)))  # slots back
        return first, after

    first, after = run_virtual(main)
    assert first[0] == SimpleNamespace(key="k0", echo=0)
    assert all(isinstance(e, ConnectionError) for e in first[1:])
    assert [r.key for r in after] == ["k0", "k1", "k2"]


def test_a_stream_that_ends_without_a_row_raises_call_incomplete_for_it():
    handle = StreamingHandle(drop={"k1"})
    sender = RowSender(handle, inflight_rows=4, rows_per_call=4, linger_s=0.05)

    async def main():
        return await asyncio.gather(*(sender.send(r) for r in requests(3)),
                                    return_exceptions=True)

    out = run_virtual(main)
    assert out[0].key == "k0" and out[2].key == "k2"
    assert isinstance(out[1], CallIncomplete)


def test_when_slots_are_scarce_a_call_waits_up_to_the_linger_to_gather_freed_slots():
    # 4 slots, rows finish 10 ms apart: without a linger each freed slot would cost a call
    handle = StreamingHandle(delay={f"k{i}": 0.01 * (i + 1) for i in range(4)})
    sender = RowSender(handle, inflight_rows=4, rows_per_call=4, linger_s=0.2)

    async def main():
        await asyncio.gather(*(sender.send(r) for r in requests(8)))

    run_virtual(main)
    assert handle.calls == [["k0", "k1", "k2", "k3"], ["k4", "k5", "k6", "k7"]]


def test_a_short_chunk_goes_after_the_linger():
    handle = StreamingHandle()
    sender = RowSender(handle, inflight_rows=8, rows_per_call=8, linger_s=0.05)

    async def main():
        loop = asyncio.get_running_loop()
        start = loop.time()
        await sender.send(requests(1)[0])
        return loop.time() - start

    took = run_virtual(main)
    assert handle.calls == [["k0"]]
    assert took == pytest.approx(0.05 + 0.01, abs=1e-6)  # the linger, then the 0.01 s call


def test_a_failed_dispatcher_fails_its_rows_and_the_next_send_restarts_it():
    handle = StreamingHandle()
    sender = RowSender(handle, inflight_rows=2, rows_per_call=2, linger_s=0.05)
    real_wait = sender._wait_change

    async def broken_wait(deadline):
        raise RuntimeError("dispatcher bug")

    async def main():
        sender._wait_change = broken_wait  # fails while gathering the first chunk
        with pytest.raises(RuntimeError, match="dispatcher bug"):
            await sender.send(requests(1)[0])
        sender._wait_change = real_wait
        return await sender.send(requests(2)[1]), sender._free

    result, free = run_virtual(main)
    assert result == SimpleNamespace(key="k1", echo=1)
    assert free == 2  # the failed row's slot came back


# --- a poison row: replica code raised on one row of a shared call ------------------

class PoisonHandle(StreamingHandle):
    """Replica code raises (RayTaskError, as Serve reports it) on any call holding "bad"."""

    def remote(self, requests):
        self.calls.append([r.key for r in requests])
        return self._poisoned(requests)

    async def _poisoned(self, requests):
        from ray.exceptions import RayTaskError
        await asyncio.sleep(0.01)
        if any(r.key == "bad" for r in requests):
            raise RayTaskError("generate_many", "Traceback ...", KeyError("max_new_tokens"))
        for r in requests:
            yield GenerateResult(key=r.key, output_token_ids=[1, 2], max_new_tokens=16,
                                 finish_reason="stop")


def _generate_rows(handle):
    from jobs.pipeline.generate_stage import GenerateRows
    from tests.unit.jobs.pipeline.test_generate_stage import RecordedIntegrity
    rows = GenerateRows.__new__(GenerateRows)  # its __init__ looks up a real Serve handle
    rows.category_label, rows.integrity = str, RecordedIntegrity()
    rows.stage = StageSettings(
        run="r", model="m", max_new_tokens=16, context_policy="reject", sampling={},
        sampling_json="{}", settings_hash="h", legacy_settings_hash="h0",
        inflight_rows_per_actor=8, rows_per_call=8, call_linger_s=0.05,
        retries=RetryConfig(max_attempts=3, backoff_initial_s=0.0, backoff_max_s=0.0),
        breaker=BreakerConfig(), metrics_category_limit=10)
    rows.sender = RowSender(handle, inflight_rows=8, rows_per_call=8, linger_s=0.05)
    rows.retries = rows.stage.retries
    from jobs.pipeline.retry import Breaker
    rows.breaker = Breaker(window_rows=10, min_rows=10, max_failure_fraction=0.5)
    return rows


def test_a_poison_row_fails_alone_and_is_not_retried():
    handle = PoisonHandle()
    gen = _generate_rows(handle)
    keys = ["a", "b", "bad", "c"]
    rows = [{"key": k, "id": k, "category": "c", "messages": "[]", "tools": None,
             "source": "f", "line": i} for i, k in enumerate(keys)]

    async def go():
        return await asyncio.gather(*(gen._one(r) for r in rows))

    outs = {o["key"]: o for o in run_virtual(go)}
    assert [outs[k]["_kind"] for k in keys] == ["data", "data", "failures", "data"]
    bad = outs["bad"]
    assert bad["error_class"] == "replica_error" and bad["retryable"] is False
    assert "KeyError" in bad["error_message"] and bad["attempts"] == 1
    assert handle.calls[0] == keys  # one shared call first ...
    assert sorted(handle.calls[1:]) == [["a"], ["b"], ["bad"], ["c"]]  # ... then one each


class EchoingHandle(StreamingHandle):
    """A replica that echoes each request's request_id, as EngineReplica.generate does."""

    async def _one(self, request):
        await asyncio.sleep(self.delay.get(request.key, 0.01))
        return SimpleNamespace(key=request.key, echo=request.n, request_id=request.request_id)


def test_a_key_sent_twice_in_one_call_gets_both_answers():
    """Futures were keyed by row key: the second request of a key overwrote the first
    one's future, which then waited forever (a continuation of a duplicated row)."""
    handle = EchoingHandle()
    sender = RowSender(handle, inflight_rows=8, rows_per_call=8, linger_s=0.05)
    twins = [SimpleNamespace(key="same", n=1), SimpleNamespace(key="same", n=2),
             SimpleNamespace(key="other", n=3)]

    async def main():
        return await asyncio.wait_for(asyncio.gather(*(sender.send(r) for r in twins)), 5)

    results = run_virtual(main)
    assert [r.echo for r in results] == [1, 2, 3]
    assert handle.calls == [["same", "same", "other"]]  # they did share one call
    assert sender._free == 8  # every slot came back


def test_a_replica_without_request_ids_is_still_matched_by_key():
    handle = StreamingHandle()  # answers carry no request_id (an older replica)
    sender = RowSender(handle, inflight_rows=4, rows_per_call=4, linger_s=0.05)

    async def main():
        return await asyncio.gather(*(sender.send(r) for r in requests(3)))
    assert [r.echo for r in run_virtual(main)] == [0, 1, 2]


def test_a_stuck_stream_fails_its_rows_at_the_call_deadline():
    """A replica that never answers (stopped, deadlocked) costs its rows a retryable
    error after call_timeout_s, never a hang."""
    from jobs.pipeline.retry import CallTimedOut, replica_error_class
    handle = StreamingHandle(delay={"k1": 10_000.0})  # k1 never comes back in time
    sender = RowSender(handle, inflight_rows=4, rows_per_call=4, linger_s=0.01,
                       call_timeout_s=30.0)

    async def main():
        return await asyncio.gather(*(sender.send(r) for r in requests(2)),
                                    return_exceptions=True)
    got = run_virtual(main)
    assert got[0].echo == 0  # what came back in time is kept
    assert isinstance(got[1], CallTimedOut) and "no result for 30 s" in str(got[1])
    assert replica_error_class(got[1]) == "replica_timeout"
    assert sender._free == 4
