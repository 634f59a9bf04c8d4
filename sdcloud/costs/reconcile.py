"""`sdcloud cost reconcile`: the cloud's own figures for each run, beside sdcloud's estimate.

- AWS: Cost Explorer GetCostAndUsage grouped by the `sdcloud:run` cost-allocation tag (the tag
  every instance carries; it must be activated in the Billing console first, and billing data
  lags by up to a day).
- Tencent Cloud: DescribeBillDetail (billing API 2018-07-09) for each attempt's instance, by
  ResourceId, month by month (the API takes one month per call).

What the bill covers is the tagged hosts: compute and their disks. The bucket, requests and
egress are shared or not tagged, so the estimate compared is compute + disk, and `cost report`
adds the estimated bucket, request and egress items to the billed amount.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta, timezone

from .. import config
from ..errors import UserError
from .ledger import DECIMALS, run_cost

TAG_RUN = "sdcloud:run"
BILLED_ITEMS = ("compute", "disk")
BILLING_ENDPOINT_ENV = "SDCLOUD_TENCENT_BILLING_ENDPOINT"


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d")


def aws_billed_by_run(start: float, end: float, client=None) -> dict[str, float]:
    """USD per run id from Cost Explorer, for [start day, end day]."""
    if client is None:
        import boto3

        # Cost Explorer has one endpoint, in us-east-1.
        client = boto3.client("ce", region_name="us-east-1")
    out: dict[str, float] = {}
    params = {"TimePeriod": {"Start": _day(start), "End": _day(end + 86400)}, "Granularity": "DAILY",
              "Metrics": ["UnblendedCost"], "GroupBy": [{"Type": "TAG", "Key": TAG_RUN}]}
    while True:
        resp = client.get_cost_and_usage(**params)
        for period in resp.get("ResultsByTime") or []:
            for group in period.get("Groups") or []:
                key = (group.get("Keys") or [""])[0]
                run_id = key.split("$", 1)[1] if "$" in key else ""
                if not run_id:
                    continue  # cost without the tag
                metric = (group.get("Metrics") or {}).get("UnblendedCost") or {}
                unit = metric.get("Unit", "USD")
                out[run_id] = out.get(run_id, 0.0) + float(metric.get("Amount") or 0.0) * config.usd_per(unit)
        token = resp.get("NextPageToken")
        if not token:
            return out
        params["NextPageToken"] = token


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


def tencent_client():
    from tencentcloud.billing.v20180709 import billing_client
    from tencentcloud.common.profile.client_profile import ClientProfile
    from tencentcloud.common.profile.http_profile import HttpProfile

    from ..providers.tencent.compute import credentials

    raw = os.environ.get(BILLING_ENDPOINT_ENV, "").strip()
    http = HttpProfile()
    if raw:
        scheme, _, host = raw.partition("://")
        http = HttpProfile(protocol=scheme, endpoint=host.rstrip("/"))
    return billing_client.BillingClient(credentials(), "", ClientProfile(httpProfile=http, language="en-US"))


def tencent_billed(instance_id: str, start: float, end: float, client=None) -> float | None:
    """What Tencent billed for one instance over [start, end] (RealCost, the account's currency); None if no line."""
    import json

    from tencentcloud.billing.v20180709 import models

    client = client or tencent_client()
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


def reconcile(state, since_seconds: float | None = 30 * 86400, threshold_pct: float = 10.0, now: float | None = None,
              aws_client=None, tencent=None) -> list[dict]:
    """Fetch the billed amounts of recent AWS and Tencent runs, store them, and compare with the estimate."""
    now = now or time.time()
    cutoff = now - (since_seconds or 30 * 86400)
    runs = [r for r in state.list_runs() if (r["created"] >= cutoff or r["updated"] >= cutoff)
            and (r.get("spec") or {}).get("provider") in ("aws", "tencent")]
    aws_runs = [r for r in runs if r["spec"].get("provider") == "aws"]
    aws_billed: dict[str, float] = {}
    if aws_runs:
        try:
            aws_billed = aws_billed_by_run(min(r["created"] for r in aws_runs), now, client=aws_client)
        except Exception as exc:  # noqa: BLE001 - botocore's errors are many; one line says which
            raise UserError(f"AWS Cost Explorer: {exc}") from None
    rows = []
    for r in runs:
        provider = r["spec"]["provider"]
        cost = run_cost(state, r, now=now)
        estimate = sum(a["items"][i]["usd"] for a in cost["attempts"] for i in BILLED_ITEMS if i in a["items"])
        billed_usd = None
        if provider == "aws":
            if r["id"] in aws_billed:
                billed_usd = aws_billed[r["id"]]
                state.set_billed(r["id"], "aws", billed_usd, "USD", billed_usd, "aws-cost-explorer")
        else:
            amount, currency, seen = 0.0, None, False
            for a in state.attempts(r["id"]):
                if not a.instance_id or a.start is None:
                    continue
                currency = currency or (state.attempt_costs(r["id"]).get(a.n) or {}).get("currency") or "CNY"
                try:
                    got = tencent_billed(a.instance_id, a.start, a.end or now, client=tencent)
                except Exception as exc:  # noqa: BLE001 - the SDK raises one exception type with a code
                    raise UserError(f"Tencent DescribeBillDetail: {exc}") from None
                if got is not None:
                    amount, seen = amount + got, True
            if seen:
                billed_usd = amount * config.usd_per(currency or "CNY")
                state.set_billed(r["id"], "tencent", amount, currency or "CNY", billed_usd, "tencent-describe-bill-detail")
        diff = None if billed_usd is None else billed_usd - estimate
        pct = None if diff is None or estimate <= 0 else 100.0 * diff / estimate
        flag = None
        if billed_usd is None:
            flag = "no bill yet"
        elif (pct is not None and abs(pct) > threshold_pct) or (estimate <= 0 and billed_usd > 0):
            flag = "off"
        rows.append({"run": r["id"], "provider": provider, "estimate_usd": round(estimate, DECIMALS),
                     "billed_usd": None if billed_usd is None else round(billed_usd, DECIMALS),
                     "difference_usd": None if diff is None else round(diff, DECIMALS),
                     "difference_pct": None if pct is None else round(pct, 1), "flag": flag})
    return rows
