"""bench/s3_faults.py: the throttling proxy forwards the store's answer as it is (one Date
header: two arrive joined, and jobs/io/lease_store.py read them naive), answers its share
as S3 does when it throttles; the flaky proxy refuses service in an outage, then serves."""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.s3_faults import FlakyProxy, ThrottlingS3Proxy


class _Store(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = b"object bytes"
        self.send_response(200)  # its own Date and Server, as moto's
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", '"abc"')
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def store():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Store)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _get(port: int) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/bucket/key")
    answer = conn.getresponse()
    answer.body = answer.read()
    conn.close()
    return answer


def test_the_stores_answer_passes_with_its_own_headers_once(store):
    proxy = ThrottlingS3Proxy(store, error_share=0.0)
    try:
        answer = _get(proxy.port)
    finally:
        proxy.close()
    assert answer.status == 200 and answer.body == b"object bytes"
    assert len(answer.msg.get_all("Date")) == 1
    assert len(answer.msg.get_all("Server")) == 1
    assert answer.getheader("ETag") == '"abc"'
    assert proxy.forwarded == 1 and proxy.total_throttled() == 0


def test_a_throttled_request_gets_s3s_error_and_its_xml_body(store):
    proxy = ThrottlingS3Proxy(store, error_share=1.0, seed=1)
    try:
        answers = [_get(proxy.port) for _ in range(8)]
    finally:
        proxy.close()
    assert {a.status for a in answers} <= {503, 500} and proxy.total_throttled() == 8
    for a in answers:
        code = b"<Code>SlowDown</Code>" if a.status == 503 else b"<Code>InternalError</Code>"
        assert code in a.body and b"<Resource>/bucket/key</Resource>" in a.body


def test_the_flaky_proxy_refuses_service_in_an_outage_then_serves(store):
    proxy = FlakyProxy(store)
    try:
        assert _get(proxy.port).status == 200
        proxy.outage()
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            _get(proxy.port)
        assert proxy.refused == 1
        proxy.restore()
        assert _get(proxy.port).body == b"object bytes"
    finally:
        proxy.close()
