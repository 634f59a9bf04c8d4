"""S3's check of a presigned (query-string) signature, before SeaweedFS, which checks none.

A URL that S3 would refuse is refused here as S3 refuses it (403 in S3's XML error envelope):
- SigV2 (`AWSAccessKeyId`, `Expires`, `Signature`): the string to sign holds the method, Content-MD5,
  Content-Type, the expiry, the x-amz-* headers and the resource ("Query string request
  authentication alternative", S3 user guide). A sender that adds a Content-Type the signer did not
  sign (urllib adds `application/x-www-form-urlencoded` to every PUT with a body) is refused with
  SignatureDoesNotMatch.
- SigV4 (`X-Amz-Algorithm=AWS4-HMAC-SHA256`): the canonical request over the headers the URL names
  in X-Amz-SignedHeaders, a signed header missing from the request refused; an expired URL refused
  with AccessDenied "Request has expired"; a lifetime over 7 days refused.
The signatures are computed with botocore's own signers (botocore.auth), from the keys the front is
given (SeaweedFS's test identity). A request signed in its Authorization header goes on unchecked.

A URL for AWS S3's own host (a virtual-hosted `bucket.s3.<region>.amazonaws.com`) may be sent here
with its Host header kept, as if DNS named this address: the signature is checked over that host,
and the request goes on to SeaweedFS path-style. `front.checked` lists (version, method, path,
verdict); `front.served` counts the bytes of presigned GETs' bodies sent back, per path-style key.
"""

from __future__ import annotations

import calendar
import http.client
import tempfile
import threading
import time
import uuid
from collections import Counter
from contextlib import closing
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from tests.support.server_http import LoopbackServer, requests_from, stream_handler, tls_context
from tests.support.server_seaweed import relay_response

MAX_EXPIRES = 7 * 24 * 3600  # SigV4's longest presigned lifetime
AWS_SUFFIX = ".amazonaws.com"


def _error(status: int, reason: str, code: str, message: str) -> bytes:
    body = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message>"
            f"<RequestId>{uuid.uuid4().hex[:16].upper()}</RequestId></Error>").encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode() + body


def bucket_path(host: str, path: str) -> str:
    """The path-style path of a request: a virtual-hosted AWS host's bucket put in front."""
    name = host.split(":")[0]
    if name.endswith(AWS_SUFFIX) and not name.startswith("s3.") and ".s3." in f".{name}":
        return f"/{name.split('.s3.')[0].split('.s3-')[0]}{path}"
    return path


def check_v4(method: str, host: str, target: str, headers: dict[str, str], secrets: dict[str, str],
             now: float) -> tuple[int, str, str] | None:
    """None when S3 would take this SigV4 query-signed request, else (status, code, message)."""
    from botocore.auth import S3SigV4QueryAuth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    split = urlsplit(target)
    params = dict(parse_qsl(split.query, keep_blank_values=True))
    try:
        akid, _day, region, service, _ = params["X-Amz-Credential"].split("/")
        stamp, expires, signed = params["X-Amz-Date"], int(params["X-Amz-Expires"]), params["X-Amz-SignedHeaders"]
        given = params["X-Amz-Signature"]
    except (KeyError, ValueError):
        return 400, "AuthorizationQueryParametersError", "Query-string authentication version 4 requires the " \
            "X-Amz-Algorithm, X-Amz-Credential, X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, and X-Amz-Expires parameters."
    if expires > MAX_EXPIRES:
        return 400, "AuthorizationQueryParametersError", "X-Amz-Expires must be less than a week (in seconds)"
    secret = secrets.get(akid)
    if secret is None:
        return 403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records."
    if now > calendar.timegm(time.strptime(stamp, "%Y%m%dT%H%M%SZ")) + expires:
        return 403, "AccessDenied", "Request has expired"
    names = signed.split(";")
    if any(n != "host" and n not in headers for n in names):
        return 403, "SignatureDoesNotMatch", "There were headers present in the request which were not signed"
    rest = "&".join(p for p in split.query.split("&") if not p.startswith("X-Amz-Signature="))
    request = AWSRequest(method=method, url=f"https://{host}{split.path}?{rest}",
                         headers={n: headers[n] for n in names if n != "host"})
    request.context["timestamp"] = stamp
    auth = S3SigV4QueryAuth(Credentials(akid, secret, params.get("X-Amz-Security-Token")), service, region, expires)
    expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
    if expected != given:
        return 403, "SignatureDoesNotMatch", "The request signature we calculated does not match the signature you " \
            "provided. Check your key and signing method."
    return None


def check_v2(method: str, host: str, target: str, headers: dict[str, str], secrets: dict[str, str],
             now: float) -> tuple[int, str, str] | None:
    """None when S3 would take this SigV2 query-signed request, else (status, code, message)."""
    from botocore.auth import HmacV1QueryAuth
    from botocore.awsrequest import HTTPHeaders
    from botocore.credentials import Credentials

    split = urlsplit(target)
    params = dict(parse_qsl(split.query, keep_blank_values=True))
    secret = secrets.get(params.get("AWSAccessKeyId", ""))
    if secret is None:
        return 403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records."
    if now > int(params.get("Expires", "0")):
        return 403, "AccessDenied", "Request has expired"

    class AtExpiry(HmacV1QueryAuth):
        def _get_date(self) -> str:  # the URL's own expiry stands where a header's Date would
            return params["Expires"]

    sent = HTTPHeaders()
    for name, value in headers.items():
        if name in ("content-md5", "content-type") or name.startswith("x-amz-"):
            sent[name] = value
    auth = AtExpiry(Credentials(params["AWSAccessKeyId"], secret), expires=0)
    kept = "&".join(p for p in split.query.split("&") if p.split("=")[0] not in ("AWSAccessKeyId", "Expires", "Signature"))
    resource = urlsplit(f"{split.path}?{kept}" if kept else split.path)
    expected = auth.get_signature(method, resource, sent, auth_path=bucket_path(host, split.path))
    if expected != unquote(params.get("Signature", "")) and expected != params.get("Signature"):
        return 403, "SignatureDoesNotMatch", "The request signature we calculated does not match the signature you " \
            "provided. Check your key and signing method."
    return None


class SignatureCheckingFront(LoopbackServer):
    thread_name = "s3-signatures"

    def __init__(self, seaweed, secrets: dict[str, str]):
        self.seaweed, self.secrets = seaweed, dict(secrets)
        self.checked: list[tuple[str, str, str, str]] = []
        self.served: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.tls, self.ca_file = tls_context(Path(tempfile.mkdtemp(prefix="sdcloud-sigfront-")), ("127.0.0.1",))
        self.bind(stream_handler(self._requests, self.tls), stream=True)
        self.endpoint = self.address("https")

    def verdict(self, method: str, target: str, lower: dict[str, str]) -> tuple[str, tuple[int, str, str] | None]:
        query = urlsplit(target).query
        host = lower.get("host", "")
        if "X-Amz-Algorithm=AWS4-HMAC-SHA256" in query:
            return "v4", check_v4(method, host, target, lower, self.secrets, time.time())
        if "Signature=" in query and "AWSAccessKeyId=" in query:
            return "v2", check_v2(method, host, target, lower, self.secrets, time.time())
        return "header", None

    def _requests(self, rfile, wfile) -> None:
        with closing(http.client.HTTPConnection("127.0.0.1", self.seaweed.port, timeout=60)) as upstream:
            for method, target, headers, lower in requests_from(rfile):
                version, refusal = self.verdict(method, target, lower)
                path = urlsplit(target).path
                with self.lock:
                    self.checked.append((version, method, path, "refused" if refusal else "taken"))
                if lower.get("expect", "").lower() == "100-continue" and refusal is None:
                    wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    wfile.flush()
                length = int(lower.get("content-length") or 0)
                body = rfile.read(length) if length else b""
                if refusal is not None:
                    status, code, message = refusal
                    wfile.write(_error(status, http.client.responses[status], code, message))
                    wfile.flush()
                    return
                host = lower.get("host", "")
                split = urlsplit(target)
                if version == "header":  # weed checks these itself, over the Host they were sent to
                    forward, fwd = target, {k: v for k, v in headers if k.lower() not in ("expect", "connection")}
                else:
                    forward, fwd = self._resigned(method, host, split, lower, body)
                upstream.request(method, forward, body=body if length or method in ("PUT", "POST") else None, headers=fwd)
                resp = upstream.getresponse()
                if method == "GET" and resp.status == 200 and version != "header":
                    data = resp.read()
                    with self.lock:
                        self.served[bucket_path(host, split.path)] += len(data)
                    out = ["HTTP/1.1 200 OK\r\n"] + [f"{k}: {v}\r\n" for k, v in resp.getheaders()
                                                      if k.lower() not in ("transfer-encoding", "content-length",
                                                                           "connection")]
                    wfile.write("".join(out + [f"Content-Length: {len(data)}\r\n\r\n"]).encode("latin-1") + data)
                    wfile.flush()
                    continue
                relay_response(resp, method, wfile)

    def _resigned(self, method: str, host: str, split, lower: dict[str, str], body: bytes) -> tuple[str, dict[str, str]]:
        """A checked query-signed request, path-style for weed, signed again in its Authorization
        header with the same key (weed would check a URL's signature over its own host and path)."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        params = dict(parse_qsl(split.query, keep_blank_values=True))
        akid = params.get("AWSAccessKeyId") or params["X-Amz-Credential"].split("/")[0]
        kept = "&".join(p for p in split.query.split("&")
                        if not p.startswith(("X-Amz-", "AWSAccessKeyId=", "Expires=", "Signature=")))
        path = bucket_path(host, split.path) + (f"?{kept}" if kept else "")
        headers = {k: v for k, v in lower.items() if k in ("content-type", "content-md5") or
                   (k.startswith("x-amz-") and k not in ("x-amz-date", "x-amz-content-sha256"))}
        headers["X-Amz-Content-SHA256"] = "UNSIGNED-PAYLOAD"
        request = AWSRequest(method=method, url=f"http://127.0.0.1:{self.seaweed.port}{path}", data=body, headers=headers)
        S3SigV4Auth(Credentials(akid, self.secrets[akid]), "s3", "us-east-1").add_auth(request)
        return path, dict(request.headers.items())
