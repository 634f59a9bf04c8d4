"""A batch job as this machine knows it: its row, its bucket, how far it got, whether it is over.

The job's row is in the runs table (kind "batch" in its spec); its items, done markers and images
are under `batch/<job>/` in its bucket. Submit, the local pool, pull and the CLI read a job here.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ..errors import UserError


def on_this_machine(provider: str) -> bool:
    """Whether a job on `provider` runs as worker processes here (local_pool.py) rather than on hosts
    of the fleet (controller.py)."""
    from ..providers.traits import Hosts, traits

    return traits(provider).hosts is Hosts.THIS_MACHINE


def state_store():
    from ..runs.state import StateStore

    return StateStore()


def find_job(job_id: str) -> dict[str, Any]:
    run = state_store().get_run(job_id)
    if run is None or run["spec"].get("kind") != "batch":
        raise UserError(f"no batch job {job_id!r}; see: sdcloud batch list")
    return run


def job_store(job: dict):
    """The open store of `job` (its spec holds the store's config)."""
    from ..runs.store import open_run_store

    return open_run_store(job["spec"]["store"])


def list_jobs() -> list[dict[str, Any]]:
    return [{"job": r["id"], "name": r.get("name"), "tier": r["tier"], "state": r["state"],
             "images": r["total_steps"], "workers": r["spec"].get("workers")}
            for r in state_store().list_runs() if r["spec"].get("kind") == "batch"]


def progress(job_id: str) -> dict[str, Any]:
    job = find_job(job_id)
    store = job_store(job)
    prefix = job["spec"]["prefix"]
    done = [json.loads(store.get(o.key)) for o in store.list(f"{prefix}/done/")]
    images = sum(len(m["images"]) for m in done)
    elapsed = max(1e-6, (job["updated"] if job["state"] in ("succeeded", "stopped", "failed", "cancelled") else time.time())
                  - job["spec"]["submitted"])
    rate = images / elapsed
    left = job["total_steps"] - images
    attempts = sum(int(m.get("attempt", 1)) for m in done)
    state = state_store()
    attempts_ = state.attempts(job["id"])  # the job's hosts: fleet attempts, or the local pool's worker processes
    # Priced by the cost ledger, as a training run's attempts are (every item; open ones up to now).
    from ..costs.ledger import run_cost

    cost = run_cost(state, job)["total_usd"] if attempts_ else 0.0
    return {"job": job_id, "state": job["state"], "name": job.get("name"), "tier": job["tier"],
            "items": job["spec"]["items"], "items_done": len(done), "images": job["total_steps"],
            "images_done": images, "images_per_s": round(rate, 3),
            "eta_s": round(left / rate) if rate > 0 and left > 0 else (0 if left <= 0 else None),
            "item_attempts": attempts, "redone_items": sum(1 for m in done if int(m.get("attempt", 1)) > 1),
            "hosts": len(attempts_), "cost_usd": round(cost, 6),
            # Redone work is inside the cost already: hosts are paid for the time they ran.
            "cost_per_image_usd": round(cost / images, 8) if images else None}


def job_over(job_id: str) -> bool:
    """Whether the job's row says it ended (cancelled, failed, succeeded, stopped): drivers stop at once."""
    from ..runs.state import FINAL_RUN_STATES

    row = state_store().get_run(job_id)
    return row is None or row["state"] in FINAL_RUN_STATES


def verify_job(job_id: str) -> dict[str, Any]:
    from sdcloud_agent.batch.verify import verify

    job = find_job(job_id)
    return {"job": job_id, **verify(job_store(job), job["spec"]["prefix"]).as_dict()}


def cancel_marked(job: dict) -> bool:
    """Whether the job's bucket holds its cancel marker (a cancel from another machine, a budget stop)."""
    from ..runs.store import StoreError

    try:
        return job_store(job).head(f"{job['spec']['prefix']}/cancel") is not None
    except (StoreError, OSError):
        return False  # unknown now; the state row is the other signal and is checked each pass

