"""Budgets: the predicted cost of the whole job before launch, and the warnings while it runs.

The prediction is what the controller is expected to pay for the job on the offer it would
launch first: compute for the expected hours including the reclaim overhead of the offer's
interruption band (the optimizer's estimate), plus the host's disk for as long. When the run
may fall back to on-demand (spot with a deadline), the fallback's cost is the prediction if it
is higher, because the controller may switch to it.
"""

from __future__ import annotations

from .. import config
from .billing_rules import HOURS_PER_MONTH, storage_price

WARN_AT = (50, 80)  # percent of the budget: logged once each
DISK_GB = 200  # the root volume the providers launch with (LaunchSpec.root_volume_gb)


def predicted_cost(estimate, disk_gb: float = DISK_GB) -> float:
    """USD for the whole job on one ranked Estimate: expected compute (reclaims included) plus its disk
    (a multi-node group's estimate, offers/groups.py: its cost already N hosts', a disk on each)."""
    row = estimate.offer.row
    disks = getattr(estimate, "nodes", 1)
    disk = disks * disk_gb * estimate.est_hours * storage_price(row.provider, "disk_gb_month") / HOURS_PER_MONTH
    return estimate.est_cost + disk * config.usd_per(row.currency)


def predict(ranked: list, market: str, deadline_hours: float | None, disk_gb: float = DISK_GB) -> tuple[float, str]:
    """(USD, what it is) for the job the controller would run: first choice, or the on-demand fallback."""
    first = ranked[0]
    cost = predicted_cost(first, disk_gb)
    what = f"{first.offer.row.instance_type} ({first.offer.market})"
    if market == "spot" and deadline_hours is not None:
        od = [e for e in ranked if e.offer.market == "on-demand"]
        if od:
            fallback = predicted_cost(od[0], disk_gb)
            if fallback > cost:
                cost, what = fallback, f"{od[0].offer.row.instance_type} (on-demand, the deadline fallback)"
    return cost, what


def warnings_due(spent: float, budget: float, logged: set[int]) -> list[int]:
    """The warning thresholds (percent) that `spent` has crossed and that were not logged yet
    (`budget` is positive: money.usd checked it when the run was made)."""
    return [pct for pct in WARN_AT if pct not in logged and spent >= budget * pct / 100.0]
