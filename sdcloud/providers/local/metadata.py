"""A metadata endpoint for hosts on this machine, so that the local provider can announce a reclaim.

It answers the paths the host agent polls on real clouds: AWS IMDSv2 (PUT /latest/api/token, then
GET /latest/meta-data/spot/instance-action with the token: 404 until a reclaim is announced, 401
without a valid token) and Tencent Cloud (GET /latest/meta-data/spot/termination-time, plain
text in UTC+8). A user watching `sdcloud up --provider local --simulate-preemption 20` sees the
same recovery a cloud reclaim causes.
"""

from __future__ import annotations

import json
import secrets
import threading
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN_PATH = "/latest/api/token"
AWS_ACTION = "/latest/meta-data/spot/instance-action"
AWS_REBALANCE = "/latest/meta-data/events/recommendations/rebalance"
TENCENT_TERMINATION = "/latest/meta-data/spot/termination-time"
CHINA = timezone(timedelta(hours=8))


class MetadataServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.reclaim_at: datetime | None = None  # when the host will be taken back
        self._tokens: set[str] = set()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet: the controller has its own log
                return None

            def _send(self, code: int, body: str = "", ctype: str = "text/plain") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                if self.path != TOKEN_PATH or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(400)
                token = secrets.token_urlsafe(24)
                server._tokens.add(token)
                self._send(200, token)

            def do_GET(self) -> None:
                if self.path in (AWS_ACTION, AWS_REBALANCE):
                    if self.headers.get("X-aws-ec2-metadata-token") not in server._tokens:
                        return self._send(401)
                    at = server.reclaim_at
                    if at is None:
                        return self._send(404)
                    stamp = at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
                    if self.path == AWS_REBALANCE:
                        return self._send(200, json.dumps({"noticeTime": stamp}), "application/json")
                    return self._send(200, json.dumps({"action": "terminate", "time": stamp}), "application/json")
                if self.path == TENCENT_TERMINATION:
                    at = server.reclaim_at
                    if at is None:
                        return self._send(404)
                    return self._send(200, at.astimezone(CHINA).strftime("%Y-%m-%d %H:%M:%S"))
                self._send(404)

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="sdcloud-metadata", daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def announce(self, notice_seconds: float) -> datetime:
        """From now on, say the host will be reclaimed `notice_seconds` from now."""
        self.reclaim_at = datetime.now(timezone.utc) + timedelta(seconds=notice_seconds)
        return self.reclaim_at

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
