"""A batch job as this machine knows it: its row, its bucket, how far it got, whether it is over.

The job's row is in the runs table (kind "batch" in its spec); its items, done markers and images
are under `batch/<job>/` in its bucket. Submit, the local pool, pull and the CLI read a job here.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ..errors import UserError
from ..offers.kinds import RunKind
from ..runs.records.run_state import FINAL_RUN_STATES, RunState

# A job that ended before its last item: what `batch status` says why of.
ENDED_SHORT = (RunState.FAILED, RunState.STOPPED, RunState.CANCELLED)


def on_this_machine(provider: str) -> bool:
    """Whether a job on `provider` runs as worker processes here (local_pool.py) rather than on hosts
    of the fleet (controller.py)."""
    from ..providers.traits import Hosts, traits

    return traits(provider).hosts is Hosts.THIS_MACHINE


def state_store():
    from ..runs.records.state import StateStore

    return StateStore()


def find_job(job_id: str) -> dict[str, Any]:
    run = state_store().get_run(job_id)
    if run is None:  # a cloud schedule's job, submitted by the cloud driver: its rows are in the stack's bucket
        from .journal import fetch

        run = fetch(state_store(), job_id)
    if run is None or RunKind.of(run["spec"]) is not RunKind.BATCH:
        raise UserError(f"no batch job {job_id!r}; see: sdcloud batch list")
    return run


def job_store(job: dict):
    """The open store of `job` (its spec holds the store's config)."""
    from ..runs.records.store import open_run_store

    return open_run_store(job["spec"]["store"])


def ended_reason(job: dict) -> str | None:
    """Why a job that did not succeed ended, in one line (a worker's traceback: its last line);
    None for a job that runs or succeeded."""
    from ..events import one_line

    if job["state"] not in ENDED_SHORT or not job.get("reason"):
        return None
    return one_line(job["reason"])


def list_jobs() -> list[dict[str, Any]]:
    return [{"job": r["id"], "name": r.get("name"), "tier": r["tier"], "state": r["state"],
             "images": r["total_steps"], "workers": r["spec"].get("workers"),
             **({"reason": why} if (why := ended_reason(r)) else {})}
            for r in state_store().list_runs() if RunKind.of(r["spec"]) is RunKind.BATCH]


def images_done(job: dict) -> int:
    """Images the job has made: the bucket's done markers; the row's last count when the bucket
    cannot be read (the cost report must not fail on a job whose bucket is gone)."""
    from ..runs.records.store import StoreError

    try:
        store = job_store(job)
        return sum(len(json.loads(store.get(o.key))["images"]) for o in store.list(f"{job['spec']['prefix']}/done/"))
    except (StoreError, OSError, ValueError, KeyError):
        return int(job.get("step") or 0)


def progress(job_id: str) -> dict[str, Any]:
    job = find_job(job_id)
    store = job_store(job)
    prefix = job["spec"]["prefix"]
    done = [json.loads(store.get(o.key)) for o in store.list(f"{prefix}/done/")]
    images = sum(len(m["images"]) for m in done)
    elapsed = max(1e-6, (job["updated"] if job["state"] in FINAL_RUN_STATES else time.time())
                  - job["spec"]["submitted"])
    rate = images / elapsed
    left = job["total_steps"] - images
    attempts = sum(int(m.get("attempt", 1)) for m in done)
    state = state_store()
    attempts_ = state.attempts(job["id"])  # the job's hosts: fleet attempts, or the local pool's worker processes
    # Priced by the cost ledger, as a training run's attempts are (every item; open ones up to now),
    # in the job's own terms as the cost report prints them (costs/job_terms.py).
    from ..costs.job_terms import in_job_terms
    from ..costs.ledger import run_cost

    terms = in_job_terms(state, run_cost(state, job), job, images)
    return {"job": job_id, "state": job["state"], "name": job.get("name"), "tier": job["tier"],
            "items": job["spec"]["items"], "items_done": len(done), "images": job["total_steps"],
            "images_done": images, "images_per_s": round(rate, 3),
            "eta_s": round(left / rate) if rate > 0 and left > 0 else (0 if left <= 0 else None),
            "item_attempts": attempts, "redone_items": sum(1 for m in done if int(m.get("attempt", 1)) > 1),
            # Redone work is inside the cost already: hosts are paid for the time they ran.
            "hosts": len(attempts_), "cost_usd": terms["total_usd"], "cost_per_image_usd": terms["cost_per_image"],
            "cost_per_1k_images_usd": terms["cost_per_1k_images"], "ondemand_usd": terms["ondemand_usd"],
            "savings_usd": terms["savings_usd"], "savings_pct": terms["savings_pct"],
            **({"reason": why} if (why := ended_reason(job)) else {})}


def job_over(job_id: str) -> bool:
    """Whether the job's row says it ended (cancelled, failed, succeeded, stopped): drivers stop at once."""
    from ..runs.records.state import FINAL_RUN_STATES

    row = state_store().get_run(job_id)
    return row is None or row["state"] in FINAL_RUN_STATES


def verify_job(job_id: str) -> dict[str, Any]:
    from sdcloud_agent.batch.verify import verify

    job = find_job(job_id)
    return {"job": job_id, **verify(job_store(job), job["spec"]["prefix"]).as_dict()}


def verdict(job_id: str) -> dict[str, Any]:
    """`batch verify`'s answer: "ok", "FAILED" (a job that finished, whose images are not each there
    exactly once: a key missing, claimed twice or indexed against the wrong worker) or "incomplete"
    (a job still running, or one that ended before its last item: cancelled, stopped, failed; what
    it made is checked, and a duplicate there is still FAILED)."""
    from ..runs.records.state import FINAL_RUN_STATES

    job = find_job(job_id)
    if job["state"] not in FINAL_RUN_STATES:
        p = progress(job["id"])
        return _said({"job": job["id"], "state": job["state"], "verdict": "incomplete", "ok": False,
                      "items_done": p["items_done"], "items": p["items"], "images_present": p["images_done"],
                      "images_expected": p["images"], "redone_items": p["redone_items"]})
    v = verify_job(job["id"])
    ended_early = job["state"] != RunState.SUCCEEDED and v["missing_items"]
    made_right = not (v["missing_images"] or v["duplicate_keys"] or v["index_mismatches"])
    word = "ok" if v["ok"] else "incomplete" if ended_early and made_right else "FAILED"
    return _said({**v, "job": job["id"], "state": job["state"], "verdict": word})


def _said(v: dict[str, Any]) -> dict[str, Any]:
    """The verdict with its line for the user (`says`): the counts, and for an incomplete job why."""
    counts = (f"{v['items_done']}/{v['items']} items, {v['images_present']}/{v['images_expected']} images, "
              f"{v['redone_items']} redone")
    if v["verdict"] != "incomplete":
        return {**v, "says": f"{v['verdict']}: {counts}"}
    if v["state"] in ENDED_SHORT:
        why = f"the job was {v['state']} before its last item; what it made is each there exactly once"
    else:
        why = f"the job is {v['state']}; verify it once it has finished (follow it with: sdcloud batch watch {v['job']})"
    return {**v, "says": f"incomplete: {counts}; {why}"}


def status_value(key: str, value: Any) -> str:
    """A `batch status` figure as the cost report prints it: dollars to 4 decimals, an image's cost to 6."""
    if value is None:
        return "unknown" if key in ("ondemand_usd", "savings_usd", "savings_pct") else ""
    if key == "cost_per_image_usd":
        return f"{value:.6f}"
    if key.endswith("_usd"):
        return f"{value:.4f}"
    if key == "savings_pct":
        return f"{value:.1f}"
    return str(value)


def cancel_marked(job: dict) -> bool:
    """Whether the job's bucket holds its cancel marker (a cancel from another machine, a budget stop)."""
    from ..runs.records.store import StoreError

    try:
        return job_store(job).head(f"{job['spec']['prefix']}/cancel") is not None
    except (StoreError, OSError):
        return False  # unknown now; the state row is the other signal and is checked each pass

