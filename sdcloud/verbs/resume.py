"""`sdcloud resume` (and `up --name` of a run that ended): the same run, active again.

The run keeps its id, bucket prefix and attempts (so the budget counts what was spent); the next
attempt restores the durable checkpoint. What a resume may change is how the run is bought and
bounded, never what it trains.
"""

from __future__ import annotations

import json

from ..costs import ledger as cost_ledger
from ..errors import UserError
from ..events import Kind
from ..fleet.lifecycle import Timing
from ..runs.driving.budget_watch import budget_spent
from ..runs.records.state import StateStore

# What a resume may change in the stored spec: how the run is bought and bounded, not what it trains.
RESUME_SAFE = ("market", "max_price", "region", "deadline_hours", "budget", "steps", "checkpoint_every", "store")
RESUME_FIXED = ("tier", "model", "trainer", "dataset", "provider")


def prepare_resume(state: StateStore, run: dict, overrides: dict) -> dict:
    """Make a stopped or failed run active again with its stored spec, with the safe overrides applied.

    A conflicting tier or model is refused. Returns what changed.
    """
    spec = dict(run["spec"])
    for key in RESUME_FIXED:
        given = overrides.get(key)
        if given is not None and str(given) != str(spec.get(key)):
            raise UserError(f"run {run['id']} ({run.get('name') or run['id']}) trains {key} {spec.get(key)!r}; "
                            f"it cannot resume with {key} {given!r} (start a new run with another --name)")
    changed = {k: v for k, v in overrides.items() if k in RESUME_SAFE and v is not None and v != spec.get(k)}
    spec.update(changed)
    total = run["total_steps"]
    if changed.get("steps"):
        if int(changed["steps"]) < run["step"]:
            raise UserError(f"--steps {changed['steps']} is below the {run['step']} steps already done")
        total = int(changed["steps"])
    spent = cost_ledger.live_cost_usd(state, run)
    poll = Timing.for_provider(str(spec.get("provider") or "local")).poll_seconds
    if spec.get("budget") is not None and budget_spent(spent, float(spec["budget"]), state.attempts(run["id"]), poll):
        raise UserError(f"run {run['id']} has already spent ${spent:.4f} of its ${float(spec['budget']):g} budget: "
                        f"resume with a larger one, e.g. --budget {max(spent * 2, spent + 1):.2f}")
    state.update_run(run["id"], spec=json.dumps(spec), total_steps=total, state="recovering", reason=None)
    state.event(run["id"], Kind.RESUME, {"from_state": run["state"], "step": run["step"], "changed": sorted(changed),
                                         "spent_usd": round(spent, 4)})
    return changed


def durable_step(run: dict) -> int | None:
    """The step the next attempt really resumes from: the newest complete checkpoint in the run's
    bucket (the host restores it, whatever a row says): 0 without one, None when it cannot be read."""
    from sdcloud_agent import manifest

    from ..runs.records.store_of import store_of

    try:
        newest = manifest.newest_complete(store_of(run), f"runs/{run['id']}")
    except Exception:  # noqa: BLE001 - no keys or network now: the row's step is said instead
        return None
    return newest.step if newest is not None else 0


def resume_words(run: dict, changed: dict) -> str:
    """`resuming run R from step N`: the step of its newest complete checkpoint (0 without one), else
    the run's recorded step where the bucket cannot be read."""
    step = durable_step(run)
    where = f"from step {step}" if step is not None else f"from step {run['step']} (as recorded here)"
    if step is None and run["step"] == 0:
        where = "from step 0"
    return (f"resuming run {run['id']}" + (f" ({run['name']})" if run.get("name") else "") + f" {where}"
            + (f" with new {', '.join(changed)}" if changed else ""))

