"""The lifecycle every fake server and front of the suite shares: bound on 127.0.0.1, answered from a
daemon thread, stopped without waiting on a thread that never ran.

A fake builds its handler (which usually calls back into the fake), then `self.bind(handler)`:
an HTTP server (`ThreadingHTTPServer`), or with `stream=True` a plain TCP one for the fronts that
read and relay bytes themselves. Port 0 unless given: the kernel picks a free one at bind time, so
no other worker or outgoing connection can take it in between. Then `start()` / `stop()`, or a
`with` block; `port` and `address(scheme)` say where it listens. `tls_context` makes the server side of
a TLS listener from a self-signed certificate (the suite's CA bundle trusts it through the file it
returns); `stream_handler` is the handler of a front: an optional TLS wrap, then one function over
the connection's read and write files, with the errors of a client that went away swallowed.
"""

from __future__ import annotations

import http.client
import json
import socketserver
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Iterator

from tests.support.server_seaweed import read_request_head, self_signed_cert

# What a client that hangs up, or a relay cut short, raises in a front's handler thread: not the
# front's failure, and a traceback per connection would bury the test's own output.
CLIENT_GONE: tuple[type[BaseException], ...] = (ssl.SSLError, OSError, http.client.HTTPException, ValueError)


class LoopbackServer:
    """Base of the suite's fakes and fronts: one server on 127.0.0.1 served from a daemon thread."""

    thread_name = "loopback-server"
    httpd: socketserver.TCPServer
    thread: threading.Thread | None = None

    def bind(self, handler: Callable[..., socketserver.BaseRequestHandler], *, port: int = 0,
             stream: bool = False) -> None:
        server_class = socketserver.ThreadingTCPServer if stream else ThreadingHTTPServer
        self.httpd = server_class(("127.0.0.1", port), handler)
        self.httpd.daemon_threads = True  # a request still being answered does not hold the process

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def address(self, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self):
        if self.thread is None:
            self.thread = threading.Thread(target=self.httpd.serve_forever, name=self.thread_name, daemon=True)
            self.thread.start()
        return self

    def stop(self) -> None:
        # shutdown() waits for serve_forever to notice: only when a thread runs it, or it waits forever.
        if self.thread is not None:
            self.httpd.shutdown()
            self.thread.join(10)
            self.thread = None
        self.httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def tls_context(directory: Path, names: tuple[str, ...] = ("127.0.0.1",)) -> tuple[ssl.SSLContext, Path]:
    """A server-side TLS context for `names`, and the certificate file a client trusts it by."""
    cert, key = self_signed_cert(directory, names)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context, cert


def stream_handler(serve: Callable[..., None], tls: ssl.SSLContext | None = None) -> type[socketserver.StreamRequestHandler]:
    """A front's handler: the connection (TLS first, with `tls`) given to `serve(rfile, wfile)`."""

    class Handler(socketserver.StreamRequestHandler):
        def setup(self):
            if tls is not None:
                self.request = tls.wrap_socket(self.request, server_side=True)
            super().setup()

        def handle(self):
            try:
                serve(self.rfile, self.wfile)
            except CLIENT_GONE:
                pass

    return Handler


class QuietHandler(BaseHTTPRequestHandler):
    """An HTTP handler that logs nothing (the test's output is its own) and answers whole bodies."""

    def log_message(self, *args) -> None:
        pass

    def send_body(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_json(self, payload: object, status: int = 200) -> None:
        # Exactly `application/json`: the Tencent SDK ignores an error body of any other type.
        self.send_body(status, json.dumps(payload).encode(), {"Content-Type": "application/json"})


def requests_from(rfile) -> Iterator[tuple[str, str, list[tuple[str, str]], dict[str, str]]]:
    """A front's requests on one connection, each head as `read_request_head` gives it, until the
    client closes the connection."""
    while True:
        head = read_request_head(rfile)
        if head is None:
            return
        yield head
