"""An S3-compatible store as many answer: HTTPS at a plain IP address, refusing trailer bodies.

MinIO, Ceph, R2, B2 and COS do not all take botocore's `aws-chunked` uploads with a checksum
trailer (no Content-Length). This front stands before SeaweedFS's plain port, at
`https://127.0.0.1:<port>` (a self-signed certificate for the address, trusted via AWS_CA_BUNDLE),
and answers such a request 411 MissingContentLength in S3's XML envelope, as COS does. Every other
request goes on unchanged (its Host header too, so SeaweedFS checks the client's own signature).
`front.refused` lists what it refused; `front.seen` every request line.
"""

from __future__ import annotations

import http.client
import tempfile
import threading
import uuid
from contextlib import closing
from pathlib import Path

from tests.support.server_seaweed import relay_response
from tests.support.server_http import LoopbackServer, requests_from, stream_handler, tls_context


class TrailerRefusingFront(LoopbackServer):
    thread_name = "s3-front"

    def __init__(self, seaweed):
        self.seaweed = seaweed
        self.seen: list[str] = []
        self.refused: list[str] = []
        self.lock = threading.Lock()
        self.tls, self.ca_file = tls_context(Path(tempfile.mkdtemp(prefix="sdcloud-front-")), ("127.0.0.1",))
        self.bind(stream_handler(self._requests, self.tls), stream=True)
        self.endpoint = self.address("https")

    @staticmethod
    def refusal(method: str, headers: dict[str, str]) -> str | None:
        if "aws-chunked" in headers.get("content-encoding", "").lower() or "x-amz-trailer" in headers:
            return "a body with a checksum trailer (aws-chunked)"
        if method in ("PUT", "POST") and "content-length" not in headers:
            return "a body without Content-Length"
        return None

    def _requests(self, rfile, wfile) -> None:
        with closing(http.client.HTTPConnection("127.0.0.1", self.seaweed.port, timeout=60)) as upstream:
            for method, path, headers, lower in requests_from(rfile):
                with self.lock:
                    self.seen.append(f"{method} {path}")
                why = self.refusal(method, lower)
                if why is not None:
                    with self.lock:
                        self.refused.append(f"{method} {path}: {why}")
                    body = (f"<?xml version='1.0' encoding='UTF-8'?>\n<Error><Code>MissingContentLength</Code>"
                            f"<Message>You must provide the Content-Length HTTP header.</Message>"
                            f"<RequestId>{uuid.uuid4().hex}</RequestId></Error>").encode()
                    wfile.write(f"HTTP/1.1 411 Length Required\r\nContent-Type: application/xml\r\n"
                                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
                    wfile.flush()
                    return  # the body is not read: answer and close, as such stores do
                if lower.get("expect", "").lower() == "100-continue":
                    wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    wfile.flush()
                length = int(lower.get("content-length") or 0)
                body = rfile.read(length) if length else b""
                fwd = {k: v for k, v in headers if k.lower() not in ("expect", "connection")}
                upstream.request(method, path, body=body if length or method in ("PUT", "POST") else None, headers=fwd)
                relay_response(upstream.getresponse(), method, wfile)
