"""A run's state and its cost report as `sdcloud up`, `status` and `cost report` show them."""

from __future__ import annotations

from ...costs import ledger as cost_ledger
from ...errors import UserError
from ...offers.catalog import load_catalog
from ...offers.groups import node_count
from ...offers.kinds import RunKind
from ...offers.optimizer import rank
from ...providers.traits import names
from . import health
from .run_spec import RunPlan, RunSpec
from .state import ACTIVE_RUN_STATES, StateStore, run_kind


def summary(state: StateStore, run_id: str) -> dict:
    """The run's state and its cost report: per attempt and in total, with savings against on-demand."""
    run = state.get_run(run_id)
    if run is None:
        raise UserError(f"no run {run_id!r}; see: sdcloud status")
    attempts = state.attempts(run["id"])
    rows = []
    ledger_cost = cost_ledger.attempt_costs_usd(state, run)
    for a in attempts:
        rows.append({"n": a.n, "provider": a.provider, "region": a.region, "zone": a.zone, "instance_type": a.instance_type,
                     "market": a.market, "price": a.price, "hours": round(a.hours, 4),
                     "cost": ledger_cost.get(a.n, round(a.cost, 4)),
                     "instance_id": a.instance_id, "start": a.start, "end": a.end, "end_reason": a.end_reason})
    kind = run_kind(run)
    out = {
        "run": run["id"], "kind": kind, "name": run["name"], "tier": run["tier"],
        "provider": run["spec"].get("provider") or "local", "state": run["state"],
        # A batch job's step is its images done, as its driver last counted them (no store read here).
        "reason": run["reason"], "step": run["step"], "total_steps": run["total_steps"], "attempts": rows,
        # From the cost ledger: every item, open attempts priced up to now (sdcloud cost report has the detail).
        "cost": cost_ledger.summary_cost(state, run),
    }
    if kind is RunKind.BATCH:
        out["workers"] = run["spec"].get("workers")
        return out
    if node_count(run["spec"]) > 1:  # a group: each host's hours and price (nodes_view.py)
        from .nodes_view import node_hours

        out["nodes_per_attempt"] = node_count(run["spec"])
        out["node_hours"] = node_hours(rows, out["nodes_per_attempt"])
    # The host's latest health verdict and its out-of-memory retries (runs/driving/health_view.py).
    out["health"] = health.latest(state, run["id"])
    spec = RunSpec(**run["spec"])
    if spec.provider in names(where=lambda t: not t.is_cloud):
        # A run on this machine or the user's boxes: what the best cloud offer would have cost (the
        # row read back as a plan: its tier resolved here, at the boundary).
        try:
            from ...speeds.book import load_book

            # Ranked as `offers` ranks: the rates recorded and observed here first.
            best = rank(RunPlan.of_run(run).tier, load_catalog(), market="spot", job_size=run["total_steps"],
                        book=load_book(state, spec.trainer))[0]
            out["best_cloud_offer"] = {k: best.as_dict()[k] for k in ("provider", "region", "instance_type", "gpu", "market",
                                                                       "price_per_hour_usd", "est_hours", "est_cost")}
        except (IndexError, UserError):
            pass
    return out


def driver_of(run: dict) -> dict | None:
    """Who drives an active run or batch job, from the driver lease in its bucket (runs/records/lease.py):
    a machine, its background controller or an invocation of the cloud function, with `live` False
    when its lease lapsed (nobody drives it), and `line`, the sentence `status` and `watch` print.
    None when no driver ever took it, when it has ended, or when its bucket cannot be read here."""
    from .lease import driving_line, holder
    from .store_of import store_of

    if run["state"] not in ACTIVE_RUN_STATES:
        return None
    try:
        h = holder(store_of(run), run["id"])
    except Exception:  # noqa: BLE001 - no bucket, no credentials here: the local view is all there is
        return None
    return None if h is None else {**h.as_dict(), "line": driving_line(h, run["id"])}
