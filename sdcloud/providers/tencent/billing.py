"""What Tencent Cloud billed each run: DescribeBillDetail (billing API 2018-07-09) per instance.

Each attempt's instance is asked for by its ResourceId, month by month (the API takes one calendar
month per call); the amounts are RealCost in the account's currency. The endpoint can be replaced
with SDCLOUD_TENCENT_BILLING_ENDPOINT (the tests' billing fake).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from typing import Any

from ...errors import UserError
from ..capabilities import Bill
from .session import credentials

BILLING_ENDPOINT_ENV = "SDCLOUD_TENCENT_BILLING_ENDPOINT"
SOURCE = "tencent-describe-bill-detail"
# The currency of an attempt whose ledger row has none (the mainland site's).
DEFAULT_CURRENCY = "CNY"


def _months(start: float, end: float) -> list[tuple[str, str]]:
    """(BeginTime, EndTime) pairs, one per calendar month that [start, end] touches."""
    out = []
    cur = datetime.fromtimestamp(start, timezone.utc)
    last = datetime.fromtimestamp(end, timezone.utc)
    while cur <= last:
        month_end = (cur.replace(day=28) + timedelta(days=4)).replace(day=1, hour=0, minute=0, second=0) - timedelta(seconds=1)
        stop = min(month_end, last)
        out.append((cur.strftime("%Y-%m-%d %H:%M:%S"), stop.strftime("%Y-%m-%d %H:%M:%S")))
        cur = month_end + timedelta(seconds=1)
    return out


def new_client():
    from tencentcloud.billing.v20180709 import billing_client
    from tencentcloud.common.profile.client_profile import ClientProfile
    from tencentcloud.common.profile.http_profile import HttpProfile

    raw = os.environ.get(BILLING_ENDPOINT_ENV, "").strip()
    http = HttpProfile()
    if raw:
        scheme, _, host = raw.partition("://")
        http = HttpProfile(protocol=scheme, endpoint=host.rstrip("/"))
    return billing_client.BillingClient(credentials(), "", ClientProfile(httpProfile=http, language="en-US"))


def instance_billed(instance_id: str, start: float, end: float, client: Any = None) -> float | None:
    """What Tencent billed for one instance over [start, end] (RealCost, the account's currency); None if no line."""
    from tencentcloud.billing.v20180709 import models

    client = client or new_client()
    total, found = 0.0, False
    for begin, stop in _months(start, end):
        offset = 0
        while True:
            req = models.DescribeBillDetailRequest()
            req.from_json_string(json.dumps({"Offset": offset, "Limit": 100, "BeginTime": begin, "EndTime": stop,
                                             "ResourceId": instance_id, "NeedRecordNum": 1}))
            resp = client.DescribeBillDetail(req)
            details = resp.DetailSet or []
            for d in details:
                if d.ResourceId != instance_id:
                    continue
                for c in d.ComponentSet or []:
                    found = True
                    total += float(c.RealCost or 0.0)
            offset += len(details)
            if not details or offset >= (resp.Total or 0):
                break
    return total if found else None


def billed(state: Any, runs: list[dict], now: float, client: Any = None) -> dict[str, Bill]:
    """The bill of each of `runs` whose instances DescribeBillDetail lists (their lines added up)."""
    out: dict[str, Bill] = {}
    for r in runs:
        amount, currency, seen = 0.0, None, False
        for a in state.attempts(r["id"]):
            if not a.instance_id or a.start is None:
                continue
            currency = currency or (state.attempt_costs(r["id"]).get(a.n) or {}).get("currency") or DEFAULT_CURRENCY
            try:
                got = instance_billed(a.instance_id, a.start, a.end or now, client=client)
            except Exception as exc:  # noqa: BLE001 - the SDK raises one exception type with a code
                raise UserError(f"Tencent DescribeBillDetail: {exc}") from None
            if got is not None:
                amount, seen = amount + got, True
        if seen:
            out[r["id"]] = Bill(amount, currency or DEFAULT_CURRENCY, SOURCE)
    return out
