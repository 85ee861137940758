"""bench/latency_proxy.py delays each request once, whole, on a keep-alive connection."""

from __future__ import annotations

import socket
import socketserver
import threading
import time

from bench.latency_proxy import LatencyProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data.upper())


def test_each_request_is_delayed_and_passed_through_whole():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with LatencyProxy("127.0.0.1", server.server_address[1], delay_s=0.05) as proxy:
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as conn:
                started = time.monotonic()
                for i in range(3):  # three requests on one connection
                    conn.sendall(b"request-%d" % i)
                    assert conn.recv(100) == b"REQUEST-%d" % i
                elapsed = time.monotonic() - started
            assert proxy.requests == 3
            assert elapsed >= 3 * 0.05  # a lower bound: each request waited its delay
    finally:
        server.shutdown()
        server.server_close()
