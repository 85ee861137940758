"""A TCP proxy that adds a fixed delay to every request, the way real S3 behaves.

    with LatencyProxy("127.0.0.1", moto_port, delay_s=0.03) as proxy:
        storage.endpoint_url = proxy.url

Each client connection gets its own upstream connection. The first bytes of each
client->server message (the first chunk after the server last spoke, so every request
on a keep-alive connection) wait ``delay_s`` before they are forwarded; the rest of a
message and every response pass through at once. That is one round trip of latency per
S3 request, whatever the client's connection pooling. Runs in a thread with its own
event loop, so synchronous code (pyarrow, boto3, Ray workers) can use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Optional


class LatencyProxy:
    def __init__(self, upstream_host: str, upstream_port: int, delay_s: float = 0.03):
        self.upstream = (upstream_host, upstream_port)
        self.delay_s = delay_s
        self.port = 0
        self.requests = 0  # messages delayed so far: one per request
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._server: Optional[asyncio.AbstractServer] = None
        self._thread: Optional[threading.Thread] = None
        self._handlers: set[asyncio.Task] = set()  # open connections, closed on stop

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "LatencyProxy":
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._serve, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="latency-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("latency proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return

        async def close() -> None:
            self._server.close()
            for task in self._handlers:
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> "LatencyProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._handlers.add(task)
        try:
            await self._pipe(client_r, client_w)
        finally:
            self._handlers.discard(task)

    async def _pipe(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            return
        turn = {"client": True}  # True: the next client bytes start a new request

        async def to_server() -> None:
            while data := await client_r.read(65536):
                if turn["client"]:
                    turn["client"] = False
                    self.requests += 1
                    await asyncio.sleep(self.delay_s)
                up_w.write(data)
                await up_w.drain()
            up_w.close()

        async def to_client() -> None:
            while data := await up_r.read(65536):
                turn["client"] = True
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        try:
            await asyncio.gather(to_server(), to_client())
        except (ConnectionError, OSError):
            pass
        finally:
            for w in (client_w, up_w):
                w.close()
                with contextlib.suppress(ConnectionError, OSError):
                    await w.wait_closed()
