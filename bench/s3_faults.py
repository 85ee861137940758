"""S3 as it fails, between a run and the local S3 server (moto): two proxies.

- ``ThrottlingS3Proxy`` (HTTP) answers a share of requests as a throttled S3 does: 503
  SlowDown or 500 InternalError with S3's XML error body (AWS's error-response format),
  every request optionally delayed.
- ``FlakyProxy`` (TCP) can refuse service for a while: an outage resets new connections
  and cuts the open ones.

Chained (the run -> FlakyProxy -> ThrottlingS3Proxy -> moto) they give a store that
throttles and goes away. Used by ``python -m bench.soak`` and by the integration trials
(tests/integration/test_s3_throttling.py, test_operator_safety.py).

Real S3 throttles a prefix under load and answers 500 now and then by design; clients
are told to retry. The body matters: the AWS C++ SDK (pyarrow's S3 client) writes an
error's body into the buffer of a small ranged read, and a body larger than the range
turned into a non-retryable INTERNAL_FAILURE ("Failed to flush response stream"). So
the error is sent with its full body, as S3 sends it, not as a bare status.
"""

from __future__ import annotations

import contextlib
import http.client
import random
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ERRORS = (
    (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    (500, "Internal Server Error", "InternalError",
     "We encountered an internal error. Please try again."),
)
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}


def error_body(code: str, message: str, resource: str) -> bytes:
    request_id = uuid.uuid4().hex[:16].upper()
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<Error>'
            f"<Code>{code}</Code><Message>{message}</Message><Resource>{resource}</Resource>"
            f"<RequestId>{request_id}</RequestId><HostId>{uuid.uuid4().hex}{uuid.uuid4().hex}"
            "</HostId></Error>").encode()


class ThrottlingS3Proxy:
    """``error_share`` of requests (0..1, changeable while it runs) get a 503 SlowDown
    (three in four) or a 500 InternalError; every request waits ``delay_s`` first."""

    def __init__(self, upstream_port: int, error_share: float = 0.1, delay_s: float = 0.0,
                 seed: int = 0):
        self.upstream_port = upstream_port
        self.error_share, self.delay_s = error_share, delay_s
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.forwarded = 0
        self.throttled: dict[str, int] = {}  # method -> error answers
        self.local = threading.local()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as S3

            def log_message(self, *args):  # quiet
                pass

            def _any(self):
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True,
                         name="s3-throttle").start()

    def _upstream(self) -> http.client.HTTPConnection:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection(
                "127.0.0.1", self.upstream_port, timeout=60)
        return conn

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        if self.delay_s:
            time.sleep(self.delay_s)
        with self.lock:
            throttle = self.random.random() < self.error_share
            status, reason, code, message = ERRORS[0 if self.random.random() < 0.75 else 1]
            if throttle:
                self.throttled[handler.command] = self.throttled.get(handler.command, 0) + 1
            else:
                self.forwarded += 1
        if throttle:
            payload = b"" if handler.command == "HEAD" else error_body(
                code, message, handler.path.split("?")[0])
            handler.send_response(status, reason)
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
            return
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP_BY_HOP}
        for attempt in range(2):  # a kept-alive upstream connection may have been closed
            conn = self._upstream()
            try:
                conn.request(handler.command, handler.path, body=body, headers=headers)
                answer = conn.getresponse()
                payload = answer.read()
                break
            except (http.client.HTTPException, OSError):
                conn.close()
                self.local.conn = None
                if attempt:
                    raise
        # the store's own Date and Server, not a second pair of the proxy's (send_response
        # adds them): two Date headers arrive joined, and read naive (jobs/io/lease_store.py)
        handler.log_request(answer.status)
        handler.send_response_only(answer.status, answer.reason)
        head = handler.command == "HEAD"  # its Content-Length is the object's size
        for key, value in answer.getheaders():
            if key.lower() not in HOP_BY_HOP and (head or key.lower() != "content-length"):
                handler.send_header(key, value)
        if not head:
            handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(payload)

    def total_throttled(self) -> int:
        with self.lock:
            return sum(self.throttled.values())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class FlakyProxy:
    """A TCP proxy in front of the S3 server that can refuse service for a while:
    during an outage it resets new connections and cuts the open ones."""

    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.down = threading.Event()
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.refused = 0
        threading.Thread(target=self._accept, daemon=True, name="s3-flaky").start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.down.is_set():
                self.refused += 1
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.upstream)
            except OSError:
                _reset(client)
                continue
            with self.lock:
                self.open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src, dst):
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        with self.lock:
            self.open.discard(src)

    def outage(self):
        self.down.set()
        with self.lock:
            for s in self.open:
                _reset(s)
            self.open.clear()

    def restore(self):
        self.down.clear()

    def close(self):
        self.listener.close()


def _reset(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()
