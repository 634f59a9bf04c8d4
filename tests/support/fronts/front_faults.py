"""A store front that misbehaves as real object stores do, before the SeaweedFS fixture's plain port.

    FaultFront(seaweed, seed=7, slowdown=0.03, reset=0.03, truncate=0.03, stall=0.02, late_500=0.03)

Each request draws (seeded) at most one fault:
  slowdown   503 SlowDown in S3's XML envelope, the request not forwarded (throttling)
  reset      the connection closed without an answer, the request not forwarded
  truncate   a GET answered with its full Content-Length but half its body, then closed
  stall      the answer held `stall_seconds` before it goes (a slow store, under the read timeout)
  late_500   a write (PUT, POST, DELETE) forwarded and committed, then answered 500 InternalError:
             the acknowledgement is lost, the object is there
`refuse(method, path, headers)` -> (status, code) or None answers a refusal instead (a role without
the grant: 403 AccessDenied; revoked keys: 403 InvalidAccessKeyId).

Plain HTTP at `endpoint` (the store's client speaks to it as to any S3-compatible endpoint); the
Host header goes on unchanged, so SeaweedFS checks the client's own signature. `injected` counts
the faults answered by kind, `seen` every request line.
"""

from __future__ import annotations

import collections
import http.client
import random
import threading
import time
import uuid
from contextlib import closing
from typing import Callable

from tests.support.server_http import LoopbackServer, requests_from, stream_handler

Refusal = Callable[[str, str, dict], "tuple[int, str] | None"]
KINDS = ("slowdown", "reset", "truncate", "stall", "late_500")
WRITES = ("PUT", "POST", "DELETE")


def error_body(code: str, message: str) -> bytes:
    return (f"<?xml version='1.0' encoding='UTF-8'?>\n<Error><Code>{code}</Code><Message>{message}</Message>"
            f"<RequestId>{uuid.uuid4().hex}</RequestId></Error>").encode()


MESSAGES = {"AccessDenied": "Access Denied", "InvalidAccessKeyId":
            "The AWS Access Key Id you provided does not exist in our records.",
            "SlowDown": "Please reduce your request rate.", "InternalError": "We encountered an internal error."}
REASONS = {403: "Forbidden", 500: "Internal Server Error", 503: "Slow Down"}


class FaultFront(LoopbackServer):
    thread_name = "fault-front"

    def __init__(self, seaweed, *, seed: int = 1, stall_seconds: float = 1.0, refuse: Refusal | None = None,
                 **rates: float):
        unknown = set(rates) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}")
        self.seaweed = seaweed
        self.rates = {k: float(rates.get(k, 0.0)) for k in KINDS}
        self.rng = random.Random(seed)
        self.stall_seconds = stall_seconds
        self.refuse = refuse
        self.injected: collections.Counter = collections.Counter()
        self.refused: list[str] = []
        self.seen: list[str] = []
        self.lock = threading.Lock()
        self.enabled = True
        self.bind(stream_handler(self._requests), stream=True)
        self.endpoint = self.address()

    def _draw(self, method: str) -> str | None:
        with self.lock:
            if not self.enabled:
                return None
            x = self.rng.random()
        for kind in KINDS:
            rate = self.rates[kind]
            if kind == "truncate" and method != "GET" or kind == "late_500" and method not in WRITES:
                x -= rate  # the draw stays aligned whatever the method
                continue
            if x < rate:
                return kind
            x -= rate
        return None

    @staticmethod
    def _answer(wfile, status: int, code: str, close: bool = False) -> None:
        body = error_body(code, MESSAGES.get(code, code))
        wfile.write(f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: application/xml\r\n"
                    f"Content-Length: {len(body)}\r\n{'Connection: close' + chr(13) + chr(10) if close else ''}\r\n"
                    .encode() + body)
        wfile.flush()

    def _requests(self, rfile, wfile) -> None:
        with closing(http.client.HTTPConnection("127.0.0.1", self.seaweed.port, timeout=60)) as upstream:
            for method, path, headers, lower in requests_from(rfile):
                with self.lock:
                    self.seen.append(f"{method} {path}")
                if lower.get("expect", "").lower() == "100-continue":
                    wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    wfile.flush()
                length = int(lower.get("content-length") or 0)
                body = rfile.read(length) if length else b""
                refusal = self.refuse(method, path, lower) if self.refuse else None
                if refusal is not None:
                    with self.lock:
                        self.refused.append(f"{method} {path}: {refusal[1]}")
                    self._answer(wfile, refusal[0], refusal[1])
                    continue
                fault = self._draw(method)
                if fault:
                    with self.lock:
                        self.injected[fault] += 1
                if fault == "slowdown":
                    self._answer(wfile, 503, "SlowDown")
                    continue
                if fault == "reset":
                    return  # closed without an answer
                if fault == "stall":
                    time.sleep(self.stall_seconds)
                fwd = {k: v for k, v in headers if k.lower() not in ("expect", "connection")}
                upstream.request(method, path, body=body if length or method in ("PUT", "POST") else None, headers=fwd)
                resp = upstream.getresponse()
                data = resp.read()
                if fault == "late_500" and 200 <= resp.status < 300:
                    self._answer(wfile, 500, "InternalError")  # committed upstream; the answer is lost
                    continue
                out = [f"HTTP/1.1 {resp.status} {resp.reason}\r\n"]
                out += [f"{k}: {v}\r\n" for k, v in resp.getheaders()
                        if k.lower() not in ("transfer-encoding", "content-length", "connection")]
                size = resp.getheader("Content-Length", "0") if method == "HEAD" else str(len(data))
                out.append(f"Content-Length: {size}\r\n\r\n")
                payload = data if method != "HEAD" else b""
                if fault == "truncate" and len(payload) > 1:
                    wfile.write("".join(out).encode("latin-1") + payload[: len(payload) // 2])
                    wfile.flush()
                    return  # the rest never comes
                wfile.write("".join(out).encode("latin-1") + payload)
                wfile.flush()


def refuse_writes(code: str = "AccessDenied") -> Refusal:
    """403 `code` to every write (a host role without s3:PutObject), reads go through."""
    return lambda method, path, headers: (403, code) if method in WRITES else None
