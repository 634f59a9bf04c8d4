"""`sdcloud cost reconcile`: the cloud's own figures for each run, beside sdcloud's estimate.

Each provider whose hosts are billed reads its own bill (`traits(name).bill`, a module of
`providers/<name>/` that satisfies capabilities.ReconcilesBill): AWS from Cost Explorer by the
`sdcloud:run` cost-allocation tag, Tencent Cloud from DescribeBillDetail per instance.

What the bill covers is the tagged hosts: compute and their disks. The bucket, requests and
egress are shared or not tagged, so the estimate compared is compute + disk, and `cost report`
adds the estimated bucket, request and egress items to the billed amount.
"""

from __future__ import annotations

import time
from typing import Any

from .. import config
from ..providers import loader
from ..providers.capabilities import Bill, ReconcilesBill
from ..providers.traits import names
from .ledger import DECIMALS, run_cost

BILLED_ITEMS = ("compute", "disk")


def _has_bill(t) -> bool:
    return t.bill is not None


def bill_reader(provider: str) -> ReconcilesBill:
    """The provider's bill reader (its `providers/<name>/` billing module), imported only now."""
    return loader.bill_reader(provider)


def reconcile(state, since_seconds: float | None = 30 * 86400, threshold_pct: float = 10.0, now: float | None = None,
              clients: dict[str, Any] | None = None) -> list[dict]:
    """Fetch the billed amounts of recent runs on billed providers, store them, and compare with the estimate.

    `clients`: an SDK client per provider name, replacing the one each bill reader would make.
    """
    now = now or time.time()
    cutoff = now - (since_seconds or 30 * 86400)
    billed_providers = names(where=_has_bill)
    runs = [r for r in state.list_runs() if (r["created"] >= cutoff or r["updated"] >= cutoff)
            and (r.get("spec") or {}).get("provider") in billed_providers]
    bills: dict[str, Bill] = {}
    for provider in billed_providers:
        mine = [r for r in runs if r["spec"].get("provider") == provider]
        if mine:
            bills.update(bill_reader(provider).billed(state, mine, now, client=(clients or {}).get(provider)))
    rows = []
    for r in runs:
        provider = r["spec"]["provider"]
        cost = run_cost(state, r, now=now)
        estimate = sum(a["items"][i]["usd"] for a in cost["attempts"] for i in BILLED_ITEMS if i in a["items"])
        billed_usd = None
        bill = bills.get(r["id"])
        if bill is not None:
            billed_usd = bill.amount * config.usd_per(bill.currency)
            state.set_billed(r["id"], provider, bill.amount, bill.currency, billed_usd, bill.source)
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
