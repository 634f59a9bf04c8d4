"""SeaweedFS under a moved clock: a front that signs every request again at the server's time.

To run the suite at another hour (docs/testing.md), libfaketime moves the clock of every process
the tests start, but not weed's: weed is a Go program, which reads the time without the C library.
It refuses a request signed more than 15 minutes away from its own time (RequestTimeTooSkewed), so
with the clock moved by hours every signed request would fail. Under FAKETIME the `seaweed` fixture
(tests/support/server_seaweed.py) therefore puts this front before weed, in a process of its own started without
libfaketime: it takes each request on the fixture's ports (HTTPS with the fixture's certificate, and
plain HTTP for the byte-level fronts), checks nothing, re-dates it to its own (the real) time, signs
it again with the test key it names (servers.TEST_KEYS: only test keys are ever signed) and passes it
to weed's plain port. Signature V4 in the Authorization header, with any payload hash; chunk
signatures of STREAMING-AWS4-HMAC-SHA256-PAYLOAD bodies are signed again too. Requests that are not
signed, or signed with a key weed does not know, go on unchanged, so weed refuses what it refused.

    python tests/support/fronts/front_clock.py --upstream PORT --cert CERT --key KEY   # prints "HTTPS_PORT HTTP_PORT"
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import hmac
import http.client
import re
import ssl
import urllib.parse
from contextlib import closing

from tests.support.server_seaweed import TEST_KEYS, relay_response
from tests.support.server_http import LoopbackServer, requests_from, stream_handler

AUTH = re.compile(r"AWS4-HMAC-SHA256\s+Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request,\s*"
                  r"SignedHeaders=([^,]+),\s*Signature=([0-9a-f]+)")
EMPTY_SHA = hashlib.sha256(b"").hexdigest()


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    return _hmac(_hmac(_hmac(_hmac(("AWS4" + secret).encode(), day), region), service), "aws4_request")


def canonical_query(query: str) -> str:
    pairs = []
    for part in query.split("&") if query else []:
        k, _, v = part.partition("=")
        pairs.append((urllib.parse.quote(urllib.parse.unquote(k), safe="-_.~"),
                      urllib.parse.quote(urllib.parse.unquote(v), safe="-_.~")))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def resign(method: str, target: str, headers: list[tuple[str, str]], body: bytes,
           now: datetime.datetime) -> tuple[list[tuple[str, str]], bytes]:
    """The request's headers and body, signed again at `now` (unchanged if not signed with a test key)."""
    lower = {k.lower(): v for k, v in headers}
    m = AUTH.match(lower.get("authorization", ""))
    if not m or m.group(1) not in TEST_KEYS:
        return headers, body
    key_id, _, region, service, signed, _ = m.groups()
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    values: dict[str, list[str]] = {}
    for k, v in headers:
        if k.lower() == "x-amz-date":
            v = amz_date
        values.setdefault(k.lower(), []).append(" ".join(v.strip().split()))
    path, _, query = target.partition("?")
    payload = lower.get("x-amz-content-sha256") or hashlib.sha256(body).hexdigest()
    canonical = "\n".join([method, path, canonical_query(query),
                           "".join(f"{h}:{','.join(values.get(h, []))}\n" for h in signed.split(";")),
                           signed, payload])
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    skey = signing_key(TEST_KEYS[key_id], day, region, service)
    signature = hmac.new(skey, to_sign.encode(), hashlib.sha256).hexdigest()
    auth = f"AWS4-HMAC-SHA256 Credential={key_id}/{scope}, SignedHeaders={signed}, Signature={signature}"
    out = []
    for k, v in headers:
        if k.lower() == "authorization":
            v = auth
        elif k.lower() == "x-amz-date":
            v = amz_date
        out.append((k, v))
    if payload == "STREAMING-AWS4-HMAC-SHA256-PAYLOAD":
        body = _resign_chunks(body, skey, amz_date, scope, signature)
    return out, body


def _resign_chunks(body: bytes, skey: bytes, amz_date: str, scope: str, seed: str) -> bytes:
    """aws-chunked with chunk signatures: each chunk's signature chains from the one before."""
    out, pos, prev = [], 0, seed
    while pos < len(body):
        eol = body.index(b"\r\n", pos)
        size_hex = body[pos:eol].split(b";", 1)[0]
        size = int(size_hex, 16)
        data = body[eol + 2: eol + 2 + size]
        to_sign = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, prev, EMPTY_SHA,
                             hashlib.sha256(data).hexdigest()])
        prev = hmac.new(skey, to_sign.encode(), hashlib.sha256).hexdigest()
        out.append(size_hex + b";chunk-signature=" + prev.encode() + b"\r\n" + data + b"\r\n")
        pos = eol + 2 + size + 2
        if size == 0:
            out.append(body[pos:])  # trailers, if any
            break
    return b"".join(out)


def read_body(rfile, lower: dict[str, str]) -> bytes:
    if "chunked" in lower.get("transfer-encoding", "").lower():
        parts = []
        while True:
            size = int(rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            parts.append(rfile.read(size))
            rfile.readline()
    length = int(lower.get("content-length") or 0)
    return rfile.read(length) if length else b""


class Front:
    def __init__(self, upstream_port: int, cert: str | None, key: str | None):
        self.upstream_port = upstream_port
        tls = None
        if cert:
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.load_cert_chain(cert, key)
        # Two listeners on one relay: HTTPS with the fixture's certificate, and plain HTTP.
        self.servers = [LoopbackServer() for _ in (tls, None)]
        for server, wrap in zip(self.servers, (tls, None)):
            server.thread_name = "clock-front"
            server.bind(stream_handler(self.serve, wrap), stream=True)

    @property
    def ports(self) -> tuple[int, int]:
        return self.servers[0].port, self.servers[1].port

    def serve(self, rfile, wfile) -> None:
        with closing(http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=300)) as upstream:
            for method, target, headers, lower in requests_from(rfile):
                if lower.get("expect", "").lower() == "100-continue":
                    wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    wfile.flush()
                body = read_body(rfile, lower)
                headers, body = resign(method, target, headers, body, datetime.datetime.now(datetime.timezone.utc))
                fwd = {}
                for k, v in headers:
                    if k.lower() in ("expect", "connection", "transfer-encoding", "content-length"):
                        continue
                    fwd[k] = v
                send_body = body if body or method in ("PUT", "POST") else None
                upstream.request(method, target, body=send_body, headers=fwd)
                relay_response(upstream.getresponse(), method, wfile)

    def serve_forever(self) -> None:
        for server in self.servers:
            server.start()
        for server in self.servers:
            server.thread.join()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", type=int, required=True)
    ap.add_argument("--cert")
    ap.add_argument("--key")
    args = ap.parse_args()
    front = Front(args.upstream, args.cert, args.key)
    print(*front.ports, flush=True)
    front.serve_forever()


if __name__ == "__main__":
    main()
