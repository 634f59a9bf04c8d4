"""A COS-behaviour layer in front of SeaweedFS: HTTPS at COS's own host names, refusing what COS refuses.

How a client reaches `https://<bucket>-<appid>.cos.<region>.myqcloud.com` on loopback: glibc does not
resolve `*.localhost` sub-domains here (nsswitch `files dns`), and /etc/hosts is not ours to edit. So
the layer is an HTTP CONNECT proxy: a client with `HTTPS_PROXY=http://127.0.0.1:<port>` (botocore and
every agent subprocess honour it) asks it for a tunnel to the real COS name and never resolves that
name itself. The layer then speaks TLS as that host (a self-signed certificate for
`*.cos.<region>.myqcloud.com`, trusted through AWS_CA_BUNDLE), so the client code, endpoint, URL
and signature are exactly production's. Requests COS would accept go on, bytes unchanged, to
SeaweedFS's plain port; SeaweedFS runs with `-s3.domainName=cos.<region>.myqcloud.com`, so it finds
the bucket in the Host header and checks the SigV4 signature over the same Host the client signed.

What COS refuses and this layer refuses too, in COS's XML error envelope
(Code, Message, Resource, RequestId, TraceId; https://www.tencentcloud.com/document/product/436/7730):
- a body without Content-Length (botocore's aws-chunked uploads with a checksum trailer):
  411 MissingContentLength;
- DeleteObjects (POST /?delete) without Content-MD5: 400 MissingContentMD5;
- path-style requests (`cos.<region>.myqcloud.com/<bucket>/...`), which buckets created since
  2024-01-01 do not take (https://www.tencentcloud.com/document/product/436/57456): 403 PathStyleDomainForbidden;
- a bucket name that is not `<name>-<appid>`: 400 InvalidBucketName.

Permissions, as CAM enforces them: `CosLayer(seaweed, policies={key_pattern: policy_json})` judges
every request signed with a matching access key (a glob: `AKID-tmp-*` for a CVM role's temporary
keys) against that CAM policy, action by action (tests/support/authz/authz_cam.py), and answers 403 AccessDenied
in COS's envelope where the policy does not allow it. Keys with no policy are the account owner's.

Create-only writes, as COS does them (not as S3 does):
- `x-cos-forbid-overwrite: true` on PUT Object: when the key exists, 409 FileAlreadyExists and
  nothing is written. Checked and written under one per-key lock, so of racing creators exactly one
  wins, as on COS. (Tencent's PUT Object page, https://www.tencentcloud.com/document/product/436/7749,
  lists the header for buckets without versioning; the 409 FileAlreadyExists answer is COS's, as
  summarised from its docs in public code we read; it is the same code and status Alibaba OSS
  documents for its x-oss-forbid-overwrite.)
- `If-None-Match` and `If-Match` on PUT are not COS request headers: PUT Object documents neither
  and says an existing object of the same name is overwritten with 200 OK; COS documents the
  conditional headers on GET/HEAD Object only (product/436/7745). So the layer drops them and the
  PUT overwrites. It re-signs the request without them (SigV4, the client's own test key), since
  SeaweedFS behind it would otherwise honour them, which COS does not.
"""

from __future__ import annotations

import http.client
import re
import socket
import socketserver
import ssl
import tempfile
import threading
import uuid
from contextlib import closing
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

from tests.support.authz import authz_cam
from tests.support.server_seaweed import TEST_KEYS
from tests.support.server_http import LoopbackServer, requests_from, tls_context

REGIONS = ("ap-guangzhou", "ap-shanghai", "ap-beijing", "ap-singapore")
COS_BUCKET_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?-[0-9]{5,12}$")
_HOST_RE = re.compile(r"^(?:(?P<bucket>[^.]+)\.)?cos\.(?P<region>[a-z0-9-]+)\.myqcloud\.com$")


class _nolock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def cos_domains(regions: tuple[str, ...] = REGIONS) -> list[str]:
    return [f"cos.{r}.myqcloud.com" for r in regions]


@dataclass
class Seen:
    """One request as the layer saw it (for assertions)."""
    method: str
    host: str
    path: str
    headers: dict[str, str]
    refused: str = ""   # a request COS refuses (the client did something COS does not take)
    answered: str = ""  # an error COS answers to a well-formed request (409 FileAlreadyExists)
    actions: tuple[str, ...] = ()  # the CAM actions judged (requests signed with a key that has a policy)
    needs: tuple = ()  # those actions as authz_cam.Need (resource and context), for least-privilege tests


def _linger(tls: ssl.SSLSocket, seconds: float = 5.0) -> None:
    """Close after a refusal as a web server does: stop sending, then read what the client is still
    sending until it closes. Closing with its body unread would make the kernel answer with a reset,
    which can reach the client before it has read the refusal (then it sees a broken connection, not
    COS's error)."""
    try:
        tls.settimeout(seconds)
        tls.shutdown(socket.SHUT_WR)
        while tls.recv(65536):
            pass
    except (OSError, ValueError):
        pass


def _error(code: str, message: str, resource: str) -> bytes:
    rid = uuid.uuid4().hex
    message, resource = escape(message), escape(resource)
    return (f"<?xml version='1.0' encoding='utf-8' ?>\n<Error>\n<Code>{code}</Code>\n<Message>{message}</Message>\n"
            f"<Resource>{resource}</Resource>\n<RequestId>{rid}</RequestId>\n<TraceId>{rid}</TraceId>\n</Error>").encode()


class CosLayer(LoopbackServer):
    thread_name = "cos-layer"

    """`with CosLayer(seaweed) as cos:` then `cos.env` (HTTPS_PROXY, NO_PROXY, AWS_CA_BUNDLE) and
    `cos.endpoint(region)` for the client; `cos.seen` lists every request."""

    def __init__(self, seaweed, regions: tuple[str, ...] = REGIONS, policies: dict[str, str] | None = None):
        self.seaweed = seaweed
        self.policies: dict[str, str] = dict(policies or {})  # access-key glob -> CAM policy (JSON)
        self.regions = regions
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self.workdir = Path(tempfile.mkdtemp(prefix="sdcloud-cos-"))
        names = tuple(n for d in cos_domains(regions) for n in (d, f"*.{d}"))
        self.tls, self.ca_file = tls_context(self.workdir / "tls", names)
        layer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                layer._serve(self.connection)

        self.bind(Handler, stream=True)

    # -- the client's side ------------------------------------------------------------------------
    @property
    def proxy(self) -> str:
        return self.address()

    @staticmethod
    def endpoint(region: str) -> str:
        return f"https://cos.{region}.myqcloud.com"

    @property
    def env(self) -> dict[str, str]:
        return {"HTTPS_PROXY": self.proxy, "https_proxy": self.proxy, "NO_PROXY": "127.0.0.1,localhost",
                "no_proxy": "127.0.0.1,localhost", "AWS_CA_BUNDLE": str(self.ca_file)}

    def denials(self) -> list[Seen]:
        """Requests refused by the CAM policy (403 AccessDenied)."""
        with self.lock:
            return [s for s in self.seen if s.refused == "AccessDenied"]

    def refusals(self) -> list[str]:
        with self.lock:
            return [s.refused for s in self.seen if s.refused]

    # -- the proxy ----------------------------------------------------------------------------------
    def _serve(self, conn: socket.socket) -> None:
        rfile = conn.makefile("rb")
        line = rfile.readline(65537).decode("latin-1")
        while rfile.readline(65537) not in (b"\r\n", b"\n", b""):
            pass
        parts = line.split()
        target = parts[1] if len(parts) == 3 and parts[0] == "CONNECT" else ""
        host = target.rsplit(":", 1)[0]
        if not _HOST_RE.match(host) or not target.endswith(":443"):
            conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        try:
            tls = self.tls.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):
            return
        try:
            self._requests(tls)
        except (ssl.SSLError, OSError, http.client.HTTPException):
            pass
        finally:
            try:
                tls.close()
            except OSError:
                pass

    def _requests(self, tls: ssl.SSLSocket) -> None:
        rfile, wfile = tls.makefile("rb"), tls.makefile("wb")
        with closing(http.client.HTTPConnection("127.0.0.1", self.seaweed.port, timeout=60)) as upstream:
            for method, path, headers, lower in requests_from(rfile):
                seen = Seen(method, lower.get("host", ""), path, lower)
                with self.lock:
                    self.seen.append(seen)
                refusal = self._refusal(method, path, lower)
                if refusal is not None:
                    status, code, message = refusal
                    seen.refused = code
                    body = _error(code, message, f"{lower.get('host', '')}{path}")
                    # The body (if any) is not read: answer and close, as COS does on a refused upload.
                    wfile.write(f"HTTP/1.1 {status} {http.client.responses.get(status, '')}\r\n"
                                f"Content-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
                                f"x-cos-request-id: {uuid.uuid4().hex}\r\nConnection: close\r\n\r\n".encode() + body)
                    wfile.flush()
                    _linger(tls)
                    return
                if lower.get("expect", "").lower() == "100-continue":
                    wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    wfile.flush()
                length = int(lower.get("content-length") or 0)
                body = rfile.read(length) if length else b""
                denial = self._denial(method, path, lower, body, seen)
                if denial is not None:
                    seen.refused = "AccessDenied"
                    err = _error("AccessDenied", denial, f"{lower.get('host', '')}{path}")
                    wfile.write(f"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\n"
                                f"Content-Length: {len(err) if method != 'HEAD' else 0}\r\n"
                                f"x-cos-request-id: {uuid.uuid4().hex}\r\n\r\n".encode() + (err if method != "HEAD" else b""))
                    wfile.flush()
                    continue
                fwd = {k: v for k, v in headers if k.lower() not in ("expect", "connection", "proxy-connection")}
                object_put = method == "PUT" and not ({"partNumber", "uploadId"} & set(parse_qs(urlsplit(path).query)))
                if object_put and ("if-none-match" in lower or "if-match" in lower):
                    # COS ignores S3's conditional PUT headers: drop them (and re-sign without them).
                    fwd = self._resign(method, path, lower, body,
                                       drop=("if-none-match", "if-match", "expect", "connection", "proxy-connection"))
                forbid = object_put and lower.get("x-cos-forbid-overwrite", "").lower() == "true"
                with self._key_lock(lower.get("host", "") + urlsplit(path).path) if forbid else _nolock():
                    if forbid and self._exists(upstream, path, lower):
                        seen.answered = "FileAlreadyExists"
                        err = _error("FileAlreadyExists", "The object already exists and x-cos-forbid-overwrite is true.",
                                     f"{lower.get('host', '')}{path}")
                        wfile.write(f"HTTP/1.1 409 Conflict\r\nContent-Type: application/xml\r\n"
                                    f"Content-Length: {len(err)}\r\nx-cos-request-id: {uuid.uuid4().hex}\r\n\r\n".encode() + err)
                        wfile.flush()
                        continue
                    upstream.request(method, path, body=body if length or method in ("PUT", "POST") else None, headers=fwd)
                    resp = upstream.getresponse()
                    data = resp.read()
                out = [f"HTTP/1.1 {resp.status} {resp.reason}\r\n"]
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        out.append(f"{k}: {v}\r\n")
                if method != "HEAD":
                    out.append(f"Content-Length: {len(data)}\r\n")
                else:
                    out.append(f"Content-Length: {resp.getheader('Content-Length', '0')}\r\n")
                out.append("\r\n")
                wfile.write("".join(out).encode("latin-1") + (data if method != "HEAD" else b""))
                wfile.flush()

    def policy_for(self, headers: dict[str, str], path: str) -> str | None:
        """The CAM policy of the request's signing key, or None (an unrestricted key)."""
        m = re.search(r"Credential=([^/,\s]+)/", headers.get("authorization", ""))
        key = m[1] if m else parse_qs(urlsplit(path).query).get("X-Amz-Credential", [""])[0].split("/")[0]
        return next((p for pattern, p in self.policies.items() if key and fnmatchcase(key, pattern)), None)

    def _denial(self, method: str, path: str, headers: dict[str, str], body: bytes, seen: Seen) -> str | None:
        """Why CAM refuses the request (the message of COS's AccessDenied), or None when allowed."""
        policy = self.policy_for(headers, path)
        if policy is None:
            return None
        m = _HOST_RE.match(headers.get("host", "").split(":")[0])
        bucket = m["bucket"] if m else None
        app_id = bucket.rsplit("-", 1)[1] if bucket else ""
        wanted = authz_cam.needs(method, bucket, m["region"] if m else "", app_id, path, headers, body)
        seen.actions = tuple(n.action for n in wanted)
        seen.needs = tuple(wanted)
        need = authz_cam.denied(policy, wanted)
        return None if need is None else f"Access Denied: {need.action} on {need.resource}"

    def _key_lock(self, key: str) -> threading.Lock:
        with self.lock:
            return self._key_locks.setdefault(key, threading.Lock())

    @staticmethod
    def _resign(method: str, path: str, headers: dict[str, str], body: bytes, drop: tuple[str, ...] = ()) -> dict[str, str]:
        """The request's headers less `drop`, signed again (SigV4) with the client's own test key and region."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        m = re.search(r"Credential=([^/]+)/\d{8}/([^/]+)/s3/", headers.get("authorization", ""))
        if m is None:
            raise ValueError("an unsigned request cannot be re-signed")
        keep = {k: v for k, v in headers.items()
                if k not in drop and k not in ("authorization", "x-amz-date", "x-amz-content-sha256", "content-length")}
        req = AWSRequest(method=method, url=f"https://{headers['host']}{path}", data=body, headers=keep)
        S3SigV4Auth(Credentials(m[1], TEST_KEYS[m[1]]), "s3", m[2]).add_auth(req)
        out = dict(req.headers.items())
        if method in ("PUT", "POST"):
            out["Content-Length"] = str(len(body))
        return out

    def _exists(self, upstream: http.client.HTTPConnection, path: str, headers: dict[str, str]) -> bool:
        """HEAD the object the PUT names, signed as its client (the caller holds the key's lock)."""
        head = self._resign("HEAD", urlsplit(path).path,
                            {"host": headers["host"], "authorization": headers["authorization"]}, b"")
        upstream.request("HEAD", urlsplit(path).path, headers=head)
        resp = upstream.getresponse()
        resp.read()
        return resp.status == 200

    @staticmethod
    def _refusal(method: str, path: str, headers: dict[str, str]) -> tuple[int, str, str] | None:
        m = _HOST_RE.match(headers.get("host", "").split(":")[0])
        if m is None:
            return 400, "InvalidURI", "the Host is not a COS endpoint"
        url = urlsplit(path)
        if m["bucket"] is None:
            if url.path not in ("", "/"):  # GET Service (list buckets) is the one path-style call COS takes
                return (403, "PathStyleDomainForbidden",
                        "path-style requests are not supported: use <bucket>.cos.<region>.myqcloud.com")
            return None
        if not COS_BUCKET_RE.match(m["bucket"]):
            return 400, "InvalidBucketName", "the bucket name must be <name>-<appid>"
        if method in ("PUT", "POST") and "content-length" not in headers:
            return 411, "MissingContentLength", "You must provide the Content-Length HTTP header."
        query = parse_qs(url.query, keep_blank_values=True)
        if method == "POST" and "delete" in query and "content-md5" not in headers:
            return 400, "MissingContentMD5", "Content-MD5 is required for DeleteObjects"
        return None
