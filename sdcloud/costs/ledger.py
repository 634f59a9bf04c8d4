"""The cost ledger: what each attempt of a run cost, item by item, kept in the state store.

The controller calls three functions: `started` when a host is up (the price it was launched at
and the list price of the same type), `observe` at every poll (progress, for the time lost to a
reclaim; a spot price sample now and then where the cloud keeps no price history) and `closed`
when the attempt ends (the spot price history of its zone where the cloud has one, the bucket's
size; then every item is priced and stored). Which of the two a provider has is its
`traits(name).spot_prices`.
`run_cost` adds a run up: items per attempt, time lost to reclaims, the on-demand
counterfactual, the billed amount when reconciliation found one.

This module takes the StateStore as an argument and never imports sdcloud.runs (runs imports costs).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from .. import config
from ..events import Kind
from ..providers.capabilities import HasPriceHistory
from ..providers.traits import traits
from ..offers.groups import group_price
from .groups import node_view, run_nodes, scale_items, spec_nodes
from .billing_rules import (Charge, bucket_charge, compute_charge, disk_charge, egress_charge, mean_price,
                            native_currency, request_charge)

# How often a spot host's price is sampled while it runs, where the cloud keeps no price history.
SAMPLE_SECONDS = 900.0
# The agent rewrites status.json every heartbeat; the controller reads it every poll (cloud hosts).
HEARTBEAT_SECONDS = 10.0
POLL_SECONDS = 5.0
# Amounts in reports are rounded to this many decimals (the same in every format).
DECIMALS = 4


def _item(name: str, charge: Charge) -> dict:
    return {"item": name, "amount": charge.amount, "currency": charge.currency,
            "usd": charge.amount * config.usd_per(charge.currency), "source": charge.source, "detail": charge.detail}


def _samples(provider: str) -> bool:
    """Whether spot on this provider is priced from sdcloud's own samples (the cloud keeps no history)."""
    return traits(provider).spot_prices == "samples"


# -- hooks for the controller ------------------------------------------------------------------------
def started(state, run_id: str, n: int, offer, market: str, disk_gb: float, zone: str | None = None,
            at: float | None = None) -> None:
    """An attempt's host is up: keep its launch price and the list price, in the provider's currency."""
    row = offer.row
    quote = row.spot_price if market == "spot" else row.ondemand_price
    state.set_attempt_costs(run_id, n, currency=row.currency, quote_price=quote, ondemand_price=row.ondemand_price,
                            disk_gb=disk_gb)
    if market == "spot" and _samples(row.provider) and quote is not None:
        # The price at launch is the first sample of the attempt's own price.
        at = at or time.time()
        state.add_price_sample(row.provider, row.region, zone or row.zone, row.instance_type, "spot", quote, row.currency, at=at)
        state.set_attempt_costs(run_id, n, last_sample=at)


def observe(state, run_id: str, attempt, status: dict | None, sample: Callable[[], list] | None = None,
            now: float | None = None) -> None:
    """Progress of a running attempt; a fresh spot price sample every SAMPLE_SECONDS (clouds without a history)."""
    now = now or time.time()
    row = state.attempt_costs(run_id).get(attempt.n) or {}
    fields: dict[str, Any] = {}
    if status and status.get("attempt") == attempt.n and status.get("step") is not None and status.get("phase") == "training":
        step = int(status["step"])
        if row.get("start_step") is None:
            fields["start_step"] = step  # the step it starts from (a resume's restored one)
        if row.get("first_step_at") is None:
            # The first trained step: what the host stamped (its model loaded, a step done), else (an
            # older agent) the first report past the step it restored. Not the trainer's start, which
            # a resumed host reports as "training" with its restored step before the model has loaded.
            if status.get("trained_at") is not None:
                fields["first_step_at"] = float(status["trained_at"])
            elif step > int(status.get("resumed_from") or 0):
                fields["first_step_at"] = float(status.get("time") or now)
        fields.update(last_step=step, last_step_at=float(status.get("time") or now))
        if status.get("it_per_s"):
            fields["it_per_s"] = float(status["it_per_s"])
    if (attempt.market == "spot" and _samples(attempt.provider) and sample is not None and attempt.zone
            and now - (row.get("last_sample") or 0.0) >= SAMPLE_SECONDS):
        try:
            points = sample()
        except Exception:  # noqa: BLE001 - a failed sample only means the previous price holds longer
            points = []
        for _, price in points[-1:]:
            state.add_price_sample(attempt.provider, attempt.region or "", attempt.zone, attempt.instance_type or "",
                                   "spot", price, row.get("currency") or native_currency(attempt.provider), at=now)
        fields["last_sample"] = now
    if fields:
        state.set_attempt_costs(run_id, attempt.n, **fields)


def closed(state, run_id: str, n: int, provider=None, store=None, events: Callable[[str, dict], None] | None = None,
           heartbeat_s: float = HEARTBEAT_SECONDS, poll_s: float = POLL_SECONDS) -> list[dict]:
    """The attempt has ended: fetch what billing needs, price every item and store it."""
    from .pricing import utc

    events = events or (lambda kind, data: None)
    a = next((x for x in state.attempts(run_id) if x.n == n), None)
    if a is None or a.start is None or a.end is None:
        return []
    if a.market == "spot" and isinstance(provider, HasPriceHistory) and traits(a.provider).spot_prices == "history" and a.zone:
        try:
            points = provider.price_history(a.instance_type, a.zone, utc(a.start - 3600), utc(a.end))
        except Exception as exc:  # noqa: BLE001 - the launch quote is the fallback, marked as such
            events(Kind.PRICE_HISTORY_FAILED, {"attempt": n, "error": str(exc)})
            points = []
        currency = traits(a.provider).billing.currency
        for at, price in points:
            state.add_price_sample(a.provider, a.region or "", a.zone, a.instance_type or "", "spot", price, currency,
                                   at=at.timestamp())
    if store is not None:
        try:
            objs = store.list(f"runs/{run_id}/")
            state.set_attempt_costs(run_id, n, bucket_bytes=sum(o.size for o in objs), bucket_objects=len(objs))
        except Exception as exc:  # noqa: BLE001 - the bucket item is then priced from the last known size
            events(Kind.BUCKET_SIZE_FAILED, {"attempt": n, "error": str(exc)})
    nodes = run_nodes(state, run_id)  # a multi-node group's attempt is N hosts (costs/groups.py)
    items = price_attempt(state, run_id, a, heartbeat_s=heartbeat_s, poll_s=poll_s, nodes=nodes)
    state.put_ledger(run_id, n, items)
    compute = next((i for i in items if i["item"] == "compute"), None)
    if compute and compute["source"] in ("price-history", "samples"):
        # A multi-node group's attempt is priced as the group: N x the host's.
        price = group_price(compute["detail"]["price_per_hour"] * config.usd_per(compute["currency"]), nodes)
        state.update_attempt(run_id, n, price=price)
        events(Kind.REPRICED, {"attempt": n, "price_usd": round(price, 5), "source": compute["source"]})
    return items


def record_egress(state, run_id: str, provider: str, nbytes: int) -> None:
    """Artifacts pulled to the user's machine: egress from the bucket, a run-level item (n = 0)."""
    before = next((i for i in state.ledger(run_id) if i["n"] == 0 and i["item"] == "egress"), None)
    total = nbytes + int(before["detail"].get("bytes", 0) if before else 0)
    item = _item("egress", egress_charge(provider, total))
    item["detail"]["bytes"] = total
    from .cloud_moves import put_run_items

    put_run_items(state, run_id, [item])  # the run's other items (a move's lines) stay


def record_move(state, run_id: str, src: str, nbytes: int, seconds: float, region: str | None = None) -> None:
    """A move between clouds: its egress and transfer lines (costs/cloud_moves.py)."""
    from .cloud_moves import record_move as record

    record(state, run_id, src, nbytes, seconds, region)


# -- pricing ----------------------------------------------------------------------------------------
def price_attempt(state, run_id: str, a, now: float | None = None, heartbeat_s: float = HEARTBEAT_SECONDS,
                  poll_s: float = POLL_SECONDS, nodes: int | None = None) -> list[dict]:
    """Every item of one attempt, priced with its provider's billing rules (a running one up to now).
    `nodes`: the hosts of each of the run's attempts (None: read from its row)."""
    costs = state.attempt_costs(run_id)
    row = costs.get(a.n) or {}
    if a.start is None:
        return []
    end = a.end if a.end is not None else (now or time.time())
    currency = row.get("currency") or native_currency(a.provider)
    quote = row.get("quote_price")
    nodes = run_nodes(state, run_id) if nodes is None else nodes  # a group: each host priced (costs/groups.py)
    if quote is None and a.price is not None:  # an attempt from before the ledger: its USD price (the group's)
        quote = a.price / config.usd_per(currency) / nodes
    points = None
    if a.market == "spot" and a.zone:
        points = [(t, p) for t, p, _ in state.price_samples(a.provider, a.zone, a.instance_type or "", "spot", end=end)]
    seconds = end - a.start
    items = [_item("compute", compute_charge(a.provider, a.market or "on-demand", a.start, end,
                                             a.end_reason if a.end is not None else None, quote, currency, points))]
    items.append(_item("disk", disk_charge(a.provider, float(row.get("disk_gb") or 0.0), seconds)))
    prev = max((c for m, c in costs.items() if m < a.n and c.get("bucket_bytes") is not None), key=lambda c: c["n"], default={})
    before_b, before_o = int(prev.get("bucket_bytes") or 0), int(prev.get("bucket_objects") or 0)
    after_b = int(row["bucket_bytes"]) if row.get("bucket_bytes") is not None else before_b
    after_o = int(row["bucket_objects"]) if row.get("bucket_objects") is not None else before_o
    items.append(_item("bucket", bucket_charge(a.provider, before_b, after_b, seconds)))
    puts = max(0, after_o - before_o) + int(seconds // heartbeat_s)
    gets = int(seconds // poll_s)
    items.append(_item("requests", request_charge(a.provider, puts, gets)))
    return scale_items(items, nodes)


def _overheads(attempts: list, costs: dict[int, dict]) -> dict[int, dict]:
    """Time lost to each reclaim, charged to the attempt that made it up: boot to its first step,
    plus the steps the reclaimed attempt had done past its last checkpoint, done again."""
    out: dict[int, dict] = {}
    ran = [a for a in attempts if a.start is not None]
    for prev, nxt in zip(ran, ran[1:]):
        if prev.end_reason not in ("preempted", "lost"):
            continue
        pc, nc = costs.get(prev.n) or {}, costs.get(nxt.n) or {}
        boot = max(0.0, (nc["first_step_at"] - nxt.start)) if nc.get("first_step_at") is not None else 0.0
        redone = 0
        if pc.get("last_step") is not None and nc.get("start_step") is not None:
            redone = max(0, int(pc["last_step"]) - int(nc["start_step"]))
        rate = nc.get("it_per_s") or pc.get("it_per_s")
        redo_s = redone / rate if rate else 0.0
        out[nxt.n] = {"after_attempt": prev.n, "boot_seconds": round(boot, 3), "redone_steps": redone,
                      "redo_seconds": round(redo_s, 3), "lost_hours": (boot + redo_s) / 3600.0}
    return out


def savings(total: float, ondemand: float) -> dict:
    """What the on-demand counterfactual would have cost more, in USD and percent, from the figures
    as rounded for the user: a run that cost what on-demand would saves 0, not -0.0000 or -0.2%
    from a difference below the last printed decimal."""
    total, ondemand = round(total, DECIMALS), round(ondemand, DECIMALS)
    saved = round(ondemand - total, DECIMALS) + 0.0  # + 0.0: no negative zero
    pct = round(100 * saved / ondemand, 1) + 0.0 if ondemand > 0 else None
    return {"savings_usd": saved, "savings_pct": pct}


def run_cost(state, run: dict, now: float | None = None) -> dict:
    """A run added up: per attempt and in total, in USD, with each figure's source."""
    from .. import clock

    now = now or clock.epoch()
    attempts = state.attempts(run["id"])
    costs = state.attempt_costs(run["id"])
    stored: dict[int, list[dict]] = {}
    for it in state.ledger(run["id"]):
        stored.setdefault(it["n"], []).append(it)
    overheads = _overheads(attempts, costs)
    nodes = spec_nodes(run.get("spec"))
    rows = []
    estimate = ondemand = lost_h = lost_usd = hours_total = 0.0
    currencies: set[str] = set()
    for a in attempts:
        if a.start is None:
            continue
        items = (stored.get(a.n) if a.end is not None and a.n in stored
                 else price_attempt(state, run["id"], a, now=now, nodes=nodes))
        end = a.end if a.end is not None else now
        hours = (end - a.start) / 3600.0
        usd = sum(i["usd"] for i in items)
        c = costs.get(a.n) or {}
        currency = c.get("currency") or native_currency(a.provider)
        currencies.add(currency)
        oh = overheads.get(a.n)
        lost = oh["lost_hours"] if oh else 0.0
        compute = next(i for i in items if i["item"] == "compute")
        rate_usd = group_price((compute["detail"].get("price_per_hour") or 0.0) * config.usd_per(compute["currency"]), nodes)
        od_price = c.get("ondemand_price")
        if od_price is None and a.market != "spot" and a.price is not None:
            od_price = a.price / config.usd_per(currency)
        # The same work on on-demand: this attempt's useful hours at the list price, disk for as long.
        useful = max(0.0, hours - lost)
        disk = next((i for i in items if i["item"] == "disk"), None)
        disk_usd_h = (disk["usd"] / hours) if disk and hours > 0 else 0.0
        # Each host at the on-demand price under the same billing rules as the attempt's own charge (AWS's
        # 60 s minimum a host included): an on-demand run saves exactly 0, never a rounding's -0.6%.
        od_compute = compute_charge(a.provider, "on-demand", a.start, a.start + useful * 3600.0, None, od_price, currency)
        od_usd = od_compute.amount * config.usd_per(currency) * nodes + disk_usd_h * useful + sum(
            i["usd"] for i in items if i["item"] in ("bucket", "requests"))
        estimate += usd
        ondemand += od_usd
        lost_h += lost
        lost_usd += lost * (rate_usd + disk_usd_h)
        hours_total += hours
        rows.append({
            "n": a.n, "provider": a.provider, "region": a.region, "zone": a.zone, "instance_type": a.instance_type,
            "market": a.market, "start": a.start, "end": a.end, "hours": round(hours, DECIMALS), "end_reason": a.end_reason,
            "currency": currency,
            "items": {i["item"]: {"amount": round(i["amount"], DECIMALS + 2), "currency": i["currency"],
                                  "usd": round(i["usd"], DECIMALS), "source": i["source"], "detail": i["detail"]} for i in items},
            "cost_usd": round(usd, DECIMALS), "ondemand_usd": round(od_usd, DECIMALS),
            "overhead": {**oh, "lost_hours": round(lost, DECIMALS)} if oh else None,
        })
    run_items = [i for i in stored.get(0, [])]
    # The cloud driver's invocations for this run (sdcloud/costs/driver.py): counted from its events.
    from .driver import driver_item

    driver = driver_item(state.events(run["id"]))
    if driver is not None and not any(i["item"] == "driver" for i in run_items):
        run_items.append(driver)
    extra = sum(i["usd"] for i in run_items)
    estimate += extra
    ondemand += extra
    billed = state.billed(run["id"])
    billed_usd = sum(b["usd"] for b in billed) if billed else None
    # The bill covers the tagged hosts (compute, disks); the bucket, requests and egress stay estimated.
    uncovered = extra + sum(i["usd"] for a in rows for name, i in a["items"].items() if name not in ("compute", "disk"))
    total = billed_usd + uncovered if billed_usd is not None else estimate
    steps = int(run.get("step") or 0)
    spec = run.get("spec") or {}
    images = spec.get("images") if isinstance(spec, dict) else None
    return {
        "run": run["id"], "name": run.get("name"), "tier": run["tier"], "provider": (spec or {}).get("provider"),
        "state": run["state"], "created": run["created"], "step": steps, "total_steps": run["total_steps"],
        "attempts": rows,
        "nodes": node_view(rows, nodes),  # a multi-node run: each node's hours and cost, the group's totals
        "run_items": {i["item"]: {"amount": round(i["amount"], DECIMALS + 2), "currency": i["currency"],
                                  "usd": round(i["usd"], DECIMALS), "source": i["source"], "detail": i["detail"]}
                      for i in run_items},
        # Only what a cloud or the simulation announced: a host lost from sight is no reclaim.
        "reclaims": sum(1 for a in attempts if a.end_reason == "preempted"),
        "lost_hours": round(lost_h, DECIMALS),
        "lost_fraction": round(lost_h / hours_total, DECIMALS) if hours_total > 0 else 0.0,
        "lost_usd": round(lost_usd, DECIMALS),
        "hours": round(hours_total, DECIMALS),
        "estimate_usd": round(estimate, DECIMALS),
        "billed_usd": round(billed_usd, DECIMALS) if billed_usd is not None else None,
        "billed": [{k: b[k] for k in ("provider", "amount", "currency", "usd", "source", "fetched")} for b in billed],
        "total_usd": round(total, DECIMALS),
        "total_source": "billed" if billed_usd is not None else "estimate",
        "unbilled_usd": round(uncovered, DECIMALS),
        "ondemand_usd": round(ondemand, DECIMALS),
        **savings(total, ondemand),
        "cost_per_1k_steps": round(total / steps * 1000, DECIMALS) if steps else None,
        "cost_per_image": round(total / images, DECIMALS) if images else None,
        "currencies": sorted(currencies),
    }


def live_cost_usd(state, run: dict, now: float | None = None) -> float:
    """The cost so far of a run, open attempts priced up to now (status, watch, budgets)."""
    return run_cost(state, run, now=now)["estimate_usd"]


def attempt_costs_usd(state, run: dict, now: float | None = None) -> dict[int, float]:
    """Each attempt's cost in USD from the ledger (every item), by attempt number."""
    return {a["n"]: a["cost_usd"] for a in run_cost(state, run, now=now)["attempts"]}


def summary_cost(state, run: dict, now: float | None = None) -> dict:
    """The cost block of a run's summary (`up`, `status`, `watch`): the ledger's totals so far."""
    c = run_cost(state, run, now=now)
    return {"total": c["total_usd"], "currency": "USD", "source": c["total_source"], "estimate": c["estimate_usd"],
            "billed": c["billed_usd"], "ondemand_equivalent": c["ondemand_usd"], "savings": c["savings_usd"],
            "savings_pct": c["savings_pct"], "reclaims": c["reclaims"], "lost_hours": c["lost_hours"]}


__all__ = ["savings", "summary_cost", "attempt_costs_usd", "started", "observe", "closed", "record_egress", "record_move",
           "price_attempt", "run_cost", "live_cost_usd", "mean_price"]
