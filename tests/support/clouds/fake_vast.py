"""A fake of Vast.ai's REST API (https://console.vast.ai/api/v0/) on its wire format, over HTTPS.

Built from vast-cli's vast.py (search__offers, create__instance, show__instances, change__bid,
destroy__instance, show__invoices) and the API reference: the same paths, bodies and envelopes.
- every call needs `Authorization: Bearer <key>`: otherwise 401 {"success": false, "error": "not_authorized"};
- GET /bundles/?q=<JSON filter>: the asks that match {field: {eq|neq|gt|gte|lt|lte|in|notin: v}},
  `type` "bid" or "on-demand", `order` and `limit`; a rented machine is not offered;
- PUT /asks/{id}/: create. With `price` an interruptible instance bidding that price (400 when it is
  under the machine's min_bid); without it an on-demand rental, and the answer does not say which;
  an ask taken or unknown: 404 {"success": false, "error": "no_such_ask"};
- GET /instances/ and /instances/{id}/; PUT /instances/bid_price/{id}/ (a paused instance whose new
  bid wins resumes); DELETE /instances/{id}/;
- `outbid(id, min_bid)`: the machine's minimum bid rises over the instance's bid: it is paused, its
  disk kept and billed; `resume(id)` brings it back on the same machine;
- GET /users/me/invoices: per-instance charges (GPU time, storage, bandwidth);
- `throttle(n)`: the next n calls answer 429, as the API's rate limit does.
`log` holds every request (method, path, query, body), for tests that read what was sent.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from tests.support.server_http import LoopbackServer, QuietHandler, tls_context

KEY = "vast-test-key-0123456789abcdef"
STORAGE_HOURS_PER_MONTH = 730.0


def ask(ask_id: int, gpu: str = "RTX 4090", num_gpus: int = 1, gpu_ram: int = 24564, dph: float = 0.30,
        min_bid: float = 0.15, geo: str = "Denmark, DK", reliability: float = 0.995, verified: bool = True, **more) -> dict:
    """One machine's offer as GET /bundles/ lists it (the fields sdcloud reads, with their units)."""
    return {"id": ask_id, "ask_contract_id": ask_id, "machine_id": 9000 + ask_id, "gpu_name": gpu, "num_gpus": num_gpus,
            "gpu_ram": gpu_ram, "cpu_ram": 65536, "cpu_cores_effective": 16, "disk_space": 500.0, "dph_total": dph,
            "dph_base": dph, "min_bid": min_bid, "reliability2": reliability, "verified": verified, "rentable": True,
            "rented": False, "geolocation": geo, "inet_up": 800.0, "inet_down": 900.0, "inet_up_cost": 0.004,
            "inet_down_cost": 0.003, "storage_cost": 0.12, "dlperf": 60.0, "cuda_max_good": 12.4,
            "duration": 30 * 86400.0, **more}


@dataclass
class FakeInstance:
    id: int
    ask: dict
    body: dict
    is_bid: bool
    bid_price: float | None
    created: float
    actual_status: str = "loading"
    intended_status: str = "running"
    running_seconds: float = 0.0
    running_since: float | None = None
    ended: float | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    reads: int = 0

    def public(self) -> dict:
        a = self.ask
        return {"id": self.id, "machine_id": a["machine_id"], "label": self.body.get("label"),
                "image_uuid": self.body.get("image"),
                "actual_status": self.actual_status, "intended_status": self.intended_status,
                "cur_state": "running" if self.actual_status == "running" else "stopped",
                "is_bid": self.is_bid, "bid_price": self.bid_price, "min_bid": a["min_bid"],
                "dph_total": self.bid_price if self.is_bid else a["dph_total"], "dph_base": a["dph_base"],
                "gpu_name": a["gpu_name"], "num_gpus": a["num_gpus"], "geolocation": a["geolocation"],
                "disk_space": self.body.get("disk"), "storage_cost": a["storage_cost"], "start_date": self.created,
                "status_msg": "outbid: paused until the bid wins" if self.paused else "", "public_ipaddr": "127.0.0.1",
                "onstart": self.body.get("onstart")}

    @property
    def paused(self) -> bool:
        return self.intended_status == "running" and self.actual_status == "exited"

    def set_running(self, running: bool, now: float) -> None:
        if running and self.running_since is None:
            self.running_since = now
        if not running and self.running_since is not None:
            self.running_seconds += now - self.running_since
            self.running_since = None

    def gpu_seconds(self, now: float) -> float:
        return self.running_seconds + ((now - self.running_since) if self.running_since is not None else 0.0)


class FakeVast:
    def __init__(self, key: str = KEY, asks: list[dict] | None = None):
        self.key = key
        self.asks: dict[int, dict] = {a["id"]: a for a in (asks if asks is not None else default_asks())}
        self.instances: dict[int, FakeInstance] = {}
        self.ended: dict[int, FakeInstance] = {}
        self.log: list[tuple[str, str, dict, dict | None]] = []
        self.throttled = 0
        self.lock = threading.RLock()
        self._next = 7_000_000
        self.boot_reads = 1  # reads of an instance before it shows running

    # --- test controls -----------------------------------------------------------------------------
    def throttle(self, n: int) -> None:
        self.throttled = n

    def outbid(self, instance_id: int | str, min_bid: float) -> None:
        with self.lock:
            inst = self.instances[int(instance_id)]
            inst.ask["min_bid"] = min_bid
            if inst.is_bid and (inst.bid_price or 0) < min_bid:
                inst.actual_status = "exited"
                inst.set_running(False, time.time())

    def resume(self, instance_id: int | str) -> None:
        with self.lock:
            inst = self.instances[int(instance_id)]
            inst.actual_status = "running"
            inst.set_running(True, time.time())

    def add_bytes(self, instance_id: int | str, up: int = 0, down: int = 0) -> None:
        with self.lock:
            inst = self.instances.get(int(instance_id)) or self.ended[int(instance_id)]
            inst.bytes_up += up
            inst.bytes_down += down

    def creates(self) -> list[dict]:
        return [body or {} for method, path, _, body in self.log if method == "PUT" and path.startswith("/asks/")]

    # --- the API -----------------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict, body: dict | None, auth: str | None) -> tuple[int, dict]:
        with self.lock:
            self.log.append((method, path, query, body))
            if auth != f"Bearer {self.key}":
                return 401, {"success": False, "error": "not_authorized", "msg": "Invalid or missing API key"}
            if self.throttled > 0:
                self.throttled -= 1
                return 429, {"success": False, "error": "too_many_requests", "msg": "API requests too frequent"}
            parts = [p for p in path.split("/") if p]
            now = time.time()
            if method == "GET" and parts == ["users", "current"]:
                return 200, {"id": 1, "username": "tester", "credit": 10.0}
            if method == "GET" and parts == ["bundles"]:
                return 200, {"offers": self._search(json.loads(query.get("q", "{}")))}
            if method == "PUT" and len(parts) == 2 and parts[0] == "asks":
                return self._create(int(parts[1]), body or {}, now)
            if method == "GET" and parts == ["instances"]:
                return 200, {"instances": [self._read(i) for i in self.instances.values()]}
            if len(parts) == 2 and parts[0] == "instances":
                inst = self.instances.get(int(parts[1]))
                if inst is None:
                    return 404, {"success": False, "error": "no_such_instance", "msg": "Instance not found"}
                if method == "GET":
                    return 200, {"instances": self._read(inst)}
                if method == "DELETE":
                    inst.set_running(False, now)
                    inst.ended = now
                    self.ended[inst.id] = self.instances.pop(inst.id)
                    inst.ask["rented"] = False
                    return 200, {"success": True}
            if method == "PUT" and len(parts) == 3 and parts[:2] == ["instances", "bid_price"]:
                inst = self.instances.get(int(parts[2]))
                if inst is None:
                    return 404, {"success": False, "error": "no_such_instance", "msg": "Instance not found"}
                price = (body or {}).get("price")
                if not inst.is_bid or price is None:
                    return 400, {"success": False, "error": "invalid_args", "msg": "not an interruptible instance"}
                inst.bid_price = float(price)
                if inst.paused and inst.bid_price >= inst.ask["min_bid"]:
                    self.resume(inst.id)
                return 200, {"success": True}
            if method == "GET" and parts == ["users", "me", "invoices"]:
                return 200, {"invoices": self._invoices(now), "current": {"charges": 0}}
            return 404, {"success": False, "error": "not_found", "msg": f"no route {method} {path}"}

    def _read(self, inst: FakeInstance) -> dict:
        inst.reads += 1
        if inst.actual_status == "loading" and inst.reads > self.boot_reads:
            inst.actual_status = "running"
            inst.set_running(True, time.time())
        return inst.public()

    def _search(self, q: dict) -> list[dict]:
        kind = q.get("type", "on-demand")
        out = []
        for a in self.asks.values():
            if a["rented"]:
                continue
            if all(_matches(a.get(k), cond) for k, cond in q.items() if k not in ("order", "limit", "type")):
                out.append(dict(a))
        key, direction = (q.get("order") or [["dph_total", "asc"]])[0]
        key = "min_bid" if kind == "bid" and key == "dph_total" else key
        out.sort(key=lambda a: a.get(key) or 0, reverse=direction == "desc")
        return out[: int(q.get("limit") or 64)]

    def _create(self, ask_id: int, body: dict, now: float) -> tuple[int, dict]:
        a = self.asks.get(ask_id)
        if a is None or a["rented"]:
            return 404, {"success": False, "error": "no_such_ask", "msg": f"Instance type by id {ask_id} is not available."}
        price = body.get("price")
        if price is not None and float(price) < a["min_bid"]:
            return 400, {"success": False, "error": "invalid_price", "msg": f"bid {price} is below the minimum {a['min_bid']}"}
        self._next += 1
        inst = FakeInstance(self._next, a, dict(body), price is not None, None if price is None else float(price), now)
        a["rented"] = True
        self.instances[inst.id] = inst
        return 200, {"success": True, "new_contract": inst.id}

    def _invoices(self, now: float) -> list[dict]:
        rows = []
        for inst in [*self.instances.values(), *self.ended.values()]:
            price = inst.bid_price if inst.is_bid else inst.ask["dph_total"]
            gpu = price * inst.gpu_seconds(now) / 3600
            life = ((inst.ended or now) - inst.created) / 3600
            storage = float(inst.body.get("disk") or 0) * inst.ask["storage_cost"] / STORAGE_HOURS_PER_MONTH * life
            bandwidth = inst.bytes_up / 1e9 * inst.ask["inet_up_cost"] + inst.bytes_down / 1e9 * inst.ask["inet_down_cost"]
            for kind, amount in (("gpu", gpu), ("storage", storage), ("bandwidth", bandwidth)):
                rows.append({"type": "charge", "instance_id": inst.id, "label": inst.body.get("label"), "kind": kind,
                             "amount": round(amount, 6), "timestamp": inst.ended or now,
                             "description": f"{kind} charges for instance {inst.id}"})
        return rows


def _matches(value, cond) -> bool:
    if not isinstance(cond, dict):
        return value == cond
    for op, want in cond.items():
        if op == "eq" and value != want or op == "neq" and value == want:
            return False
        if op in ("gt", "gte", "lt", "lte") and (value is None or not {
                "gt": value > want, "gte": value >= want, "lt": value < want, "lte": value <= want}[op]):
            return False
        if op == "in" and not any(value == w or (isinstance(value, str) and value.endswith(f", {w}")) for w in want):
            return False
        if op == "notin" and value in want:
            return False
    return True


def default_asks() -> list[dict]:
    return [ask(101, "RTX 4090", dph=0.30, min_bid=0.14), ask(102, "RTX 4090", dph=0.34, min_bid=0.16, geo="Canada, CA"),
            ask(103, "L40S", gpu_ram=46068, dph=0.80, min_bid=0.40), ask(104, "RTX 4060 Ti", gpu_ram=16380, dph=0.10,
                                                                          min_bid=0.05),
            ask(105, "RTX 3090", gpu_ram=24576, dph=0.20, min_bid=0.09, reliability=0.90)]


class FakeVastServer(LoopbackServer):
    """The fake behind HTTPS on 127.0.0.1; `url` is what SDCLOUD_VAST_ENDPOINT takes, `ca_file` the certificate."""

    thread_name = "fake-vast"

    def __init__(self, tmp: Path, fake: FakeVast | None = None):
        self.fake = fake or FakeVast()
        context, self.ca_file = tls_context(tmp)
        fake_ref = self.fake

        class Handler(QuietHandler):
            def _serve(self, method: str) -> None:
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                path = url.path.removeprefix("/api/v0")
                status, payload = fake_ref.handle(method, path, query, body, self.headers.get("Authorization"))
                self.send_json(payload, status)

            def do_GET(self):
                self._serve("GET")

            def do_PUT(self):
                self._serve("PUT")

            def do_DELETE(self):
                self._serve("DELETE")

            def do_POST(self):
                self._serve("POST")

        self.bind(Handler)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)

    @property
    def url(self) -> str:
        return f"{self.address('https')}/api/v0"
