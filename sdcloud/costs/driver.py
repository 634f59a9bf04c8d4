"""The cloud driver's own invocations, as a line item of the runs it drove (`sdcloud cost report`).

What is counted: each invocation of the function that took a run's lease leaves one
`driver-took-over` event in the run's journal (sdcloud/driver/unattended.py), naming the invocation;
the item counts the distinct invocations among them (copies of one event, which journals written
before events had an identity held, and an invocation named twice count once). While a run is live,
the handler keeps taking its steps until the invocation's time is nearly spent, so such an
invocation lasts about the function's timeout less the handler's safety margin. The item is
therefore: invocations x (request price + (timeout - safety) s x memory GB x GB-second price), an
upper bound (an invocation that finishes the run stops early), priced at list price without the
free tier: the free tier is the account's, shared by every run and every other function, so a run
is charged as if it had none. docs/runs.md ("The cloud driver's cost") has the month's figures.

The function's timeout, memory, margin and prices are its provider's `traits(name).function`, the
one copy that the stacks and the handler read too. A function without a cited price (Tencent SCF:
its unit prices could not be read into a citable figure) has its invocations counted and their
GB-seconds given, priced at 0 with source "unpriced" rather than a guessed price.
"""

from __future__ import annotations

from ..events import Kind
from ..providers.traits import CloudFunction, has_function, names, traits


def functions() -> dict[str, CloudFunction]:
    """Every provider's cloud function, by the driver name its lease and journal record."""
    return {f.name: f for f in (traits(n).function for n in names(where=has_function)) if f is not None}


def invocations(events: list[dict]) -> dict[str, int]:
    """Invocations of each cloud driver that took the run, from its events: each invocation once (by
    its name in the lease; an event of an older sdcloud that named none, by the event's identity)."""
    from ..events import identity

    known = functions()
    seen: dict[str, set[str]] = {}
    for e in events:
        if e["kind"] == Kind.DRIVER_TOOK_OVER:
            data = e.get("data") or {}
            name = data.get("driver")
            if name in known:
                seen.setdefault(name, set()).add(str(data.get("invocation") or identity(e["time"], e["kind"], data)))
    return {name: len(ids) for name, ids in seen.items()}


def seconds_per_invocation(fn: CloudFunction) -> float:
    """How long one invocation that keeps stepping a live run lasts: the timeout less the margin."""
    return float(fn.timeout_seconds) - fn.safety_seconds


def driver_item(events: list[dict]) -> dict | None:
    """The run's `driver` item in the ledger's form, or None when no cloud driver took the run."""
    counts = invocations(events)
    if not counts:
        return None
    known = functions()
    usd = 0.0
    per_driver = {}
    unpriced = []
    seconds = memory_gb = 0.0
    for name, n in sorted(counts.items()):
        fn = known[name]
        seconds, memory_gb = seconds_per_invocation(fn), fn.memory_gb
        gb_s = n * seconds * memory_gb
        priced = fn.request_usd is not None and fn.gb_second_usd is not None
        cost = n * fn.request_usd + gb_s * fn.gb_second_usd if priced else 0.0
        if not priced:
            unpriced.append(name)
        usd += cost
        per_driver[name] = {"invocations": n, "gb_seconds": round(gb_s, 1), "usd": round(cost, 6)}
    return {"item": "driver", "amount": usd, "currency": "USD", "usd": usd,
            "source": "unpriced" if unpriced and usd == 0 else "list-price",
            "detail": {"drivers": per_driver, "seconds_per_invocation": seconds, "memory_gb": memory_gb,
                       "unpriced": unpriced}}
