"""What AWS billed each run: Cost Explorer's GetCostAndUsage grouped by the `sdcloud:run` tag.

The tag is on every instance (and its volumes); it must be activated as a cost-allocation tag in
the Billing console first, and billing data lags by up to a day. The amounts are the tagged hosts'
compute and disks (`sdcloud cost reconcile` compares them with that part of the estimate).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from ... import config
from ...errors import UserError
from ..base import TAG_RUN
from ..capabilities import Bill

SOURCE = "aws-cost-explorer"


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d")


def billed_by_run(start: float, end: float, client: Any = None) -> dict[str, float]:
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


def billed(state: Any, runs: list[dict], now: float, client: Any = None) -> dict[str, Bill]:
    """The bill of each of `runs` that Cost Explorer shows (one query from the oldest run's day)."""
    if not runs:
        return {}
    try:
        usd = billed_by_run(min(r["created"] for r in runs), now, client=client)
    except Exception as exc:  # noqa: BLE001 - botocore's errors are many; one line says which
        raise UserError(f"AWS Cost Explorer: {exc}") from None
    return {r["id"]: Bill(usd[r["id"]], "USD", SOURCE) for r in runs if r["id"] in usd}
