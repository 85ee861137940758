"""serve_apps.engine_client: parse_meta shapes and HTTP error classification.

The server is a real aiohttp app on 127.0.0.1 (ephemeral port), per test.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Awaitable, Callable

import pytest
from aiohttp import web

from serve_apps.engine_client import EngineClient, parse_meta
from contract.outcomes import EngineBusy, EngineBadRequest, EngineServerError, EngineUnavailable

# --- parse_meta -------------------------------------------------------------------------


def test_length_finish_with_length_and_spec_fields():
    out = parse_meta({"text": "abc", "output_ids": [1, 2, 3], "meta_info": {
        "finish_reason": {"type": "length", "length": 4096}, "prompt_tokens": 10,
        "completion_tokens": 4096, "cached_tokens": 8, "spec_verify_ct": 1024,
        "spec_accept_length": 4.0, "reasoning_tokens": 4000, "e2e_latency": 12.5}})
    assert out.text == "abc" and out.output_ids == [1, 2, 3]
    assert out.finish_reason == "length" and out.finish_length == 4096
    assert out.matched_stop is None
    assert (out.prompt_tokens, out.completion_tokens, out.cached_tokens) == (10, 4096, 8)
    assert out.spec_verify_ct == 1024 and out.reasoning_tokens == 4000
    assert out.e2e_latency_s == 12.5


def test_stop_with_matched_token_id():
    out = parse_meta({"text": "x", "output_ids": [5, 151645], "meta_info": {
        "finish_reason": {"type": "stop", "matched": 151645}, "prompt_tokens": 3,
        "completion_tokens": 2}})
    assert out.finish_reason == "stop"
    assert out.matched_stop == "151645"
    assert out.finish_length is None


def test_stop_with_matched_string():
    out = parse_meta({"text": "x", "meta_info": {
        "finish_reason": {"type": "stop", "matched": "</answer>"}}})
    assert out.matched_stop == "</answer>"


def test_abort():
    out = parse_meta({"text": "", "meta_info": {
        "finish_reason": {"type": "abort", "message": "client disconnected"}}})
    assert out.finish_reason == "abort"


def test_missing_spec_and_counts_use_fallbacks():
    out = parse_meta({"text": None, "output_ids": [1, 2, 3, 4],
                      "meta_info": {"finish_reason": {"type": "stop", "matched": None}}})
    assert out.text == ""
    assert out.spec_verify_ct is None
    assert out.completion_tokens == 4  # from output_ids
    assert out.prompt_tokens == 0 and out.cached_tokens == 0
    assert out.reasoning_tokens is None and out.e2e_latency_s is None
    assert out.matched_stop is None


def test_spec_verify_zero_means_none():
    out = parse_meta({"meta_info": {"finish_reason": "stop", "spec_verify_ct": 0,
                                    "cached_tokens": None}})
    assert out.spec_verify_ct is None and out.cached_tokens == 0


@pytest.mark.parametrize("finish, kind", [("stop", "stop"), ("length", "length"),
                                          ("abort", "abort"), ("weird", "abort"),
                                          (None, "abort"), ({"type": "eos"}, "abort")])
def test_finish_reason_shapes(finish, kind):
    assert parse_meta({"meta_info": {"finish_reason": finish}}).finish_reason == kind


def test_no_meta_at_all():
    out = parse_meta({})
    assert out.finish_reason == "abort" and out.output_ids == [] and out.completion_tokens == 0


# --- error classification against a real HTTP server ------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _with_server(handler: Handler, call):
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    client = EngineClient(f"http://127.0.0.1:{port}", request_timeout_s=5)
    try:
        return await call(client)
    finally:
        await client.close()
        await runner.cleanup()


def run(handler: Handler, call):
    return asyncio.run(_with_server(handler, call))


def responder(status: int, **kwargs) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        if "json" in kwargs:
            return web.json_response(kwargs["json"], status=status)
        return web.Response(status=status, text=kwargs.get("text", ""))
    return handle


def generate(client: EngineClient):
    return client.generate([1, 2, 3], {"max_new_tokens": 8}, rid="r-1")


def test_200_parses_and_sends_body():
    seen = {}

    async def handle(request):
        seen["path"], seen["body"] = request.path, await request.json()
        return web.json_response({"text": "hi", "output_ids": [7], "meta_info": {
            "finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": 3,
            "completion_tokens": 1}})

    out = run(handle, generate)
    assert out.text == "hi" and out.matched_stop == "2"
    assert seen == {"path": "/generate", "body": {
        "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8}, "rid": "r-1",
        "stream": False, "require_reasoning": True}}


def test_503_is_unavailable():
    with pytest.raises(EngineUnavailable) as info:
        run(responder(503, text="starting"), generate)
    assert str(info.value) == "HTTP 503: starting"
    assert info.value.retryable


@pytest.mark.parametrize("status", [500, 502, 504])
def test_other_5xx_is_server_error(status):
    with pytest.raises(EngineServerError) as info:
        run(responder(status, json={"error": {"message": "CUDA error"}}), generate)
    assert str(info.value) == f"HTTP {status}: CUDA error"
    assert info.value.retryable


def test_400_is_bad_request_with_message():
    body = {"object": "error", "message": "The input (20000 tokens) is longer than the "
            "model's context length (16384 tokens).", "code": 400}
    with pytest.raises(EngineBadRequest) as info:
        run(responder(400, json=body), generate)
    assert str(info.value) == f"HTTP 400: {body['message']}"
    assert not info.value.retryable
    assert type(info.value) is EngineBadRequest


@pytest.mark.parametrize("status", [408, 429])
def test_408_and_429_are_busy_and_retried(status):
    with pytest.raises(EngineBusy) as info:
        run(responder(status, json={"error": "too many requests"}), generate)
    assert str(info.value) == f"HTTP {status}: too many requests"
    assert info.value.retryable and info.value.error_class == "engine_busy"


def test_400_plain_text_and_string_error():
    with pytest.raises(EngineBadRequest) as info:
        run(responder(422, text="x" * 2000), generate)
    assert str(info.value) == "HTTP 422: " + "x" * 500
    with pytest.raises(EngineBadRequest) as info:
        run(responder(400, json={"error": "bad sampling param"}), generate)
    assert str(info.value) == "HTTP 400: bad sampling param"


def test_connection_refused_is_unavailable():
    with socket.socket() as sock:  # bound, never listening: connect is refused at once
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

        async def call():
            client = EngineClient(f"http://127.0.0.1:{port}", request_timeout_s=5)
            try:
                await generate(client)
            finally:
                await client.close()

        with pytest.raises(EngineUnavailable) as info:
            asyncio.run(call())
    assert "calling /generate" in str(info.value)


def test_timeout_is_unavailable():
    async def slow(request):
        await asyncio.sleep(0.6)
        return web.json_response({})

    async def call(client):
        short = EngineClient(client.base_url, request_timeout_s=0.2)
        try:
            return await generate(short)
        finally:
            await short.close()

    with pytest.raises(EngineUnavailable):
        run(slow, call)


async def _generate_against_raw(handle) -> None:
    """One generate call against a raw TCP server running ``handle`` (a broken HTTP peer)."""
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = EngineClient(f"http://127.0.0.1:{port}", request_timeout_s=5)
    try:
        await generate(client)
    finally:
        await client.close()
        server.close()
        await server.wait_closed()


def test_connection_dropped_mid_body_is_unavailable():
    # The engine dies while sending its answer: a connection problem, so retryable
    # EngineUnavailable, not an untyped aiohttp.ClientPayloadError.
    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"te")
        await writer.drain()
        writer.close()

    with pytest.raises(EngineUnavailable):
        asyncio.run(_generate_against_raw(handle))


def test_healthy_true_false():
    assert run(responder(200, text=""), lambda c: c.healthy()) is True
    assert run(responder(503, text=""), lambda c: c.healthy()) is False
    assert run(responder(404, text=""), lambda c: c.healthy()) is False


def test_tokenize_and_metrics_text():
    async def handle(request):
        if request.path == "/tokenize":
            body = await request.json()
            assert body == {"prompt": "ab", "add_special_tokens": False}
            return web.json_response({"tokens": [1, 2], "count": 2})
        return web.Response(text="# HELP x\nx 1\n", content_type="text/plain")

    async def call(client):
        return await client.tokenize("ab"), await client.metrics_text()

    assert run(handle, call) == ([1, 2], "# HELP x\nx 1\n")


# --- stale keep-alive connections (uvicorn closes idle ones after 5 s) ------------------

GENERATE_OK = (b'{"text": "hi", "output_ids": [7], "meta_info": {"finish_reason": '
               b'{"type": "length", "length": 1}, "prompt_tokens": 3, "completion_tokens": 1}}')


def test_pool_drops_idle_connections_before_sglang_keepalive():
    # SGLang serves with uvicorn's timeout_keep_alive = SGLANG_TIMEOUT_KEEP_ALIVE (5 s):
    # a pooled connection older than that may be closed just as a request goes out.
    from serve_apps.engine_client import KEEPALIVE_S

    async def main():
        client = EngineClient("http://127.0.0.1:1", request_timeout_s=5)
        try:
            return client._get_session().connector._keepalive_timeout
        finally:
            await client.close()
    assert KEEPALIVE_S < 5.0 and asyncio.run(main()) == KEEPALIVE_S


def test_request_on_a_connection_the_server_closed_is_sent_again():
    """The server closes a kept-alive connection as the next request arrives (what a
    keep-alive timeout racing a request looks like): the call succeeds on a new one."""
    requests_per_connection: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests_per_connection.append(0)
        me = len(requests_per_connection) - 1
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            requests_per_connection[me] += 1
            if requests_per_connection[me] > 1:  # the keep-alive timeout fired: no answer
                writer.close()
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\nConnection: keep-alive\r\n\r\n%s"
                         % (len(GENERATE_OK), GENERATE_OK))
            await writer.drain()

    async def main():
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = EngineClient(f"http://127.0.0.1:{port}", request_timeout_s=5)
        try:
            return [await generate(client), await generate(client)]
        finally:
            await client.close()
            server.close()

    first, second = asyncio.run(main())
    assert first.text == second.text == "hi"
    # The second call went out on the kept-alive connection, found it closed, and was
    # answered on a new one.
    assert requests_per_connection == [2, 1]


def test_server_that_always_disconnects_is_unavailable_after_one_resend():
    attempts = []

    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        attempts.append(1)
        writer.close()  # no answer at all, every time

    with pytest.raises(EngineUnavailable, match="ServerDisconnectedError"):
        asyncio.run(_generate_against_raw(handle))
    assert len(attempts) == 2
