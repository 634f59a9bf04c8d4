"""A fake Tencent Cloud billing API (2018-07-09), DescribeBillDetail only, on loopback.

Same contract as tests/support/fake_tencent_api.py (TC3-HMAC-SHA256 with service `billing`, the
`{"Response": ...}` envelope, HTTP 200 application/json), and what the real action refuses:
BeginTime and EndTime in different months, Limit over 100, field names the SDK does not know.
Bill lines are added in-process with `add_line`.
"""

from __future__ import annotations

import json
import threading
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone

from tests.support.fake_tencent_api import SECRET_ID, SECRET_KEY, ApiError, TencentApiHandler, verify_tc3
from tests.support.server_http import LoopbackServer

API_VERSION = "2018-07-09"
SERVICE = "billing"


@dataclass
class BillLine:
    resource_id: str
    real_cost: float
    begin: str  # "YYYY-MM-DD HH:MM:SS", Beijing time in the real API; compared as text here
    end: str
    product: str = "cvm"
    tags: dict[str, str] = field(default_factory=dict)


class FakeBilling:
    def __init__(self, secret_id: str = SECRET_ID, secret_key: str = SECRET_KEY):
        self.accounts = {secret_id: secret_key}
        self.lines: list[BillLine] = []
        self.calls: list[dict] = []
        self.lock = threading.Lock()

    def add_line(self, resource_id: str, real_cost: float, begin: str, end: str, **kw) -> None:
        with self.lock:
            self.lines.append(BillLine(resource_id, real_cost, begin, end, **kw))

    def handle(self, action: str, params: dict) -> dict:
        with self.lock:
            if action != "DescribeBillDetail":
                raise ApiError("InvalidAction", f"action {action} is not supported by the fake")
            from tencentcloud.billing.v20180709 import models

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                models.DescribeBillDetailRequest()._deserialize(json.loads(json.dumps(params)))
            useless = [str(w.message) for w in caught if "useless" in str(w.message)]
            if useless:
                raise ApiError("UnknownParameter", "; ".join(useless))
            self.calls.append(params)
            return self._describe(params)

    def _describe(self, p: dict) -> dict:
        limit, offset = int(p.get("Limit", 0)), int(p.get("Offset", 0))
        if not 1 <= limit <= 100:
            raise ApiError("InvalidParameterValue", "Limit must be between 1 and 100")
        begin, end = p.get("BeginTime"), p.get("EndTime")
        if not begin or not end:
            raise ApiError("MissingParameter", "BeginTime and EndTime (or Month) are required")
        for t in (begin, end):
            try:
                datetime.strptime(t, "%Y-%m-%d %H:%M:%S")
            except ValueError:
                raise ApiError("InvalidParameterValue", f"time {t!r} is not YYYY-MM-DD HH:MM:SS") from None
        if begin[:7] != end[:7]:
            raise ApiError("InvalidParameterValue", "BeginTime and EndTime must be in the same month")
        found = [ln for ln in self.lines if ln.begin <= end and ln.end >= begin
                 and (not p.get("ResourceId") or ln.resource_id == p["ResourceId"])]
        page = found[offset:offset + limit]
        return {"DetailSet": [self._detail(ln) for ln in page], "Total": len(found), "Context": ""}

    @staticmethod
    def _detail(ln: BillLine) -> dict:
        cost = f"{ln.real_cost:.8f}"
        return {"ResourceId": ln.resource_id, "ProductCode": "p_" + ln.product, "BusinessCode": "p_" + ln.product,
                "PayModeName": "Pay-as-you-go", "FeeBeginTime": ln.begin, "FeeEndTime": ln.end,
                "BillMonth": ln.begin[:7], "BillDay": ln.begin[8:10],
                "ComponentSet": [{"ComponentCodeName": "CPU/GPU", "ItemCodeName": "instance", "Cost": cost,
                                  "RealCost": cost, "CashPayAmount": cost, "VoucherPayAmount": "0",
                                  "IncentivePayAmount": "0", "Discount": "1"}],
                "Tags": [{"TagKey": k, "TagValue": v} for k, v in ln.tags.items()]}


class _Handler(TencentApiHandler):
    fake: FakeBilling

    def do_POST(self) -> None:
        body = self.body()

        def call() -> dict:
            verify_tc3(self, body, self.fake.accounts, SERVICE)
            if self.headers.get("X-TC-Version") != API_VERSION:
                raise ApiError("InvalidParameter", f"X-TC-Version must be {API_VERSION}")
            return self.fake.handle(self.headers.get("X-TC-Action", ""), json.loads(body or b"{}"))

        self.answer(call)


class BillingServer(LoopbackServer):
    """`with BillingServer() as srv: srv.endpoint, srv.billing`."""

    thread_name = "fake-billing"

    def __init__(self):
        self.billing = FakeBilling()
        self.bind(type("H", (_Handler,), {"fake": self.billing}))

    @property
    def endpoint(self) -> str:
        return self.address()


__all__ = ["BillingServer", "FakeBilling", "datetime", "timezone"]
