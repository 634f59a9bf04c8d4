"""The cloud driver's own invocations, as a line item of the runs it drove (`sdcloud cost report`).

What is counted: each invocation of the function that took a run's lease leaves one
`driver-took-over` event in the run's journal (sdcloud/runs/unattended.py). While a run is live,
the handler keeps taking its steps until the invocation's time is nearly spent, so such an
invocation lasts about the function's timeout less the handler's safety margin. The item is
therefore: invocations x (request price + (timeout - safety) s x memory GB x GB-second price), an
upper bound (an invocation that finishes the run stops early), priced at list price without the
free tier: the free tier is the account's, shared by every run and every other function, so a run
is charged as if it had none. docs/runs.md ("The cloud driver's cost") has the month's figures.

Prices (USD, x86, first tier):
- AWS Lambda: $0.20 per 1M requests and $0.0000166667 per GB-second
  (https://aws.amazon.com/lambda/pricing/, us-east-1, as transcribed on 2026-09-20; free tier
  1M requests and 400,000 GB-seconds a month).
- Tencent SCF: its per-GBs and per-invocation unit prices are on https://www.tencentcloud.com/document/product/583/17234,
  which we could not read into a citable figure; its invocations are counted and their GB-seconds
  given, priced at 0 with source "unpriced" rather than a guessed price.
"""

from __future__ import annotations

# The function's configuration (stacks/aws/driver_policy.py, stacks/tencent/scf_policy.py) and
# the handler's margin (sdcloud/runs/unattended.py SAFETY_SECONDS).
FUNCTION_TIMEOUT_S = 240.0
SAFETY_S = 30.0
MEMORY_GB = 0.5
PRICES = {
    "aws-lambda": {"request_usd": 0.20 / 1_000_000, "gb_second_usd": 0.0000166667,
                   "source": "https://aws.amazon.com/lambda/pricing/ (2026-09-20)"},
}
DRIVERS = ("aws-lambda", "tencent-scf")


def invocations(events: list[dict]) -> dict[str, int]:
    """Invocations of each cloud driver that took the run, from its events."""
    out: dict[str, int] = {}
    for e in events:
        if e["kind"] == "driver-took-over":
            name = (e.get("data") or {}).get("driver")
            if name in DRIVERS:
                out[name] = out.get(name, 0) + 1
    return out


def driver_item(events: list[dict]) -> dict | None:
    """The run's `driver` item in the ledger's form, or None when no cloud driver took the run."""
    counts = invocations(events)
    if not counts:
        return None
    seconds = FUNCTION_TIMEOUT_S - SAFETY_S
    usd = 0.0
    per_driver = {}
    unpriced = []
    for name, n in sorted(counts.items()):
        gb_s = n * seconds * MEMORY_GB
        price = PRICES.get(name)
        cost = n * price["request_usd"] + gb_s * price["gb_second_usd"] if price else 0.0
        if price is None:
            unpriced.append(name)
        usd += cost
        per_driver[name] = {"invocations": n, "gb_seconds": round(gb_s, 1), "usd": round(cost, 6)}
    return {"item": "driver", "amount": usd, "currency": "USD", "usd": usd,
            "source": "unpriced" if unpriced and usd == 0 else "list-price",
            "detail": {"drivers": per_driver, "seconds_per_invocation": seconds, "memory_gb": MEMORY_GB,
                       "unpriced": unpriced}}
