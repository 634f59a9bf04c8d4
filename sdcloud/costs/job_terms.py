"""A batch job's cost in its own terms: per image and per 1,000 images, not per 1,000 steps.

`ledger.run_cost` adds up a job's hosts as it adds up a training run's attempts. What differs is
the unit of work (images made so far, which the job's bucket counts) and what is known of the
on-demand counterfactual: the same worker hours at the on-demand list price. Where a host's
on-demand price was never recorded (a spot host whose offer had none), the counterfactual is
unknown, and the job claims no savings rather than "saved $-0.0184" against an on-demand $0.

`batch status` and `cost report` both call `in_job_terms`, so the two print the same figures.
"""

from __future__ import annotations

from ..offers.kinds import RunKind
from .ledger import DECIMALS, savings

# A cheap image costs a fraction of a cent: six decimals, so a running job does not read $0.0000.
IMAGE_DECIMALS = 6


def ondemand_known(state, run_id: str, attempts: list[dict]) -> bool:
    """Whether every host of the job has an on-demand price: recorded at launch, or its own price
    when it ran on demand."""
    costs = state.attempt_costs(run_id)
    return all((costs.get(a["n"]) or {}).get("ondemand_price") is not None or a.get("market") != "spot"
               for a in attempts)


def in_job_terms(state, cost: dict, run: dict, images_done: int | None = None) -> dict:
    """`cost` (ledger.run_cost of a batch job) with the job's figures: images done and planned, $ per
    image and per 1,000 images, and on-demand and savings set to None when the counterfactual is unknown."""
    images = int(images_done if images_done is not None else (run.get("step") or 0))
    total = cost["total_usd"]
    out = dict(cost)
    out.update(kind=RunKind.BATCH, images_done=images, images=int(run.get("total_steps") or 0), cost_per_1k_steps=None,
               cost_per_image=round(total / images, IMAGE_DECIMALS) if images else None,
               cost_per_1k_images=round(total / images * 1000, DECIMALS) if images else None)
    if not ondemand_known(state, run["id"], cost["attempts"]):
        out.update(ondemand_usd=None, savings_usd=None, savings_pct=None)
    else:
        out.update(savings(total, cost["ondemand_usd"]))
    return out
