"""A run's budget while it runs: when it counts as spent, and its 50% and 80% warnings."""

from __future__ import annotations

from ...events import Kind
from .owner import RunOwner


def budget_spent(spent: float, budget: float, attempts: list, poll_seconds: float) -> bool:
    """Whether the budget leaves less than two polls of the latest host's price: the controller
    stops there, so that the host's save and terminate still fit (the same rule before a launch,
    during an attempt and at a resume)."""
    price = (attempts[-1].price or 0.0) if attempts else 0.0
    return spent + price * 2 * poll_seconds / 3600 >= budget


def budget_warnings(owner: RunOwner, spent: float) -> None:
    """Log once each when the run has spent 50% and 80% of its budget (also across restarts: the
    shares already warned about are read back from the run's events once)."""
    from ...costs.budget import warnings_due

    memo = owner.memo
    if memo.budget_warned is None:
        memo.budget_warned = {e["data"].get("pct") for e in owner.state.events(owner.run_id)
                              if e["kind"] is Kind.BUDGET_WARNING}
    for pct in warnings_due(spent, owner.spec.budget, memo.budget_warned):
        memo.budget_warned.add(pct)
        owner.event(Kind.BUDGET_WARNING, {"pct": pct, "budget": owner.spec.budget, "spent": round(spent, 4)})
