"""What raygen's S3 client puts on the wire. pyarrow's AWS SDK sends uploads aws-chunked
with a trailing CRC64 by default; a store that does not decode that framing keeps it as
the object (the unreadable parts of the node-loss run). raygen's filesystem must send
plain bodies. A tiny HTTP endpoint records the upload requests' headers."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading

_XML = b'<?xml version="1.0" encoding="UTF-8"?>'
_KEEP = ("x-amz-checksum", "x-amz-trailer", "content-encoding", "x-amz-content-sha256")


def capture_upload_headers(use_raygen: bool) -> list[dict]:
    """Write one object through an S3 filesystem to a recording endpoint: the headers
    of every request that carried the object's bytes."""
    seen: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self, body: bytes = b"") -> None:
            self.send_response(200)
            self.send_header("ETag", '"e"')
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self):  # PutObject / UploadPart
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen.append({k.lower(): v for k, v in self.headers.items()
                         if k.lower().startswith(_KEEP)})
            self._reply()

        def do_POST(self):  # create / complete multipart upload
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._reply(_XML + (b"<InitiateMultipartUploadResult><UploadId>u</UploadId>"
                                b"</InitiateMultipartUploadResult>" if "uploads" in self.path
                                else b"<CompleteMultipartUploadResult><ETag>\"e\"</ETag>"
                                b"</CompleteMultipartUploadResult>"))

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        if use_raygen:
            from jobs.config import StorageConfig
            from jobs.io.storage import locate
            fs = locate("s3://bkt", StorageConfig(endpoint_url=endpoint)).fs
        else:
            import pyarrow.fs as pafs
            fs = pafs.S3FileSystem(endpoint_override=endpoint[len("http://"):], scheme="http",
                                   region="us-east-1")
        with fs.open_output_stream("bkt/part.parquet") as out:
            out.write(b"PAR1" * 5000)
    finally:
        server.shutdown()
    return seen


def _in_fresh_process(use_raygen: bool) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_REQUEST_CHECKSUM")}
    env.update(AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x", AWS_EC2_METADATA_DISABLED="true")
    code = ("import json; from tests.contract.jobs.io.test_s3_wire import capture_upload_headers; "
            f"print(json.dumps(capture_upload_headers({use_raygen})))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_pyarrow_default_sends_aws_chunked_bodies():
    """The cause, pinned: if this stops failing-as-expected, pyarrow changed its default."""
    uploads = _in_fresh_process(use_raygen=False)
    assert uploads and all(h.get("content-encoding") == "aws-chunked" for h in uploads)


def test_raygen_s3_filesystem_sends_plain_bodies():
    uploads = _in_fresh_process(use_raygen=True)
    assert uploads
    for headers in uploads:
        assert "content-encoding" not in headers and "x-amz-trailer" not in headers, headers
        assert not headers.get("x-amz-content-sha256", "").startswith("STREAMING"), headers
