"""What an attempt measured, kept when it ends: every run teaches the optimizer its own figures.

From the cost ledger's per-attempt progress (costs/ledger.observe: the first and last training step
the host reported, with their times, and the trainer's it/s) and the host's boot report:
  rate          the steady rate after warm-up: the trainer's last it/s, else steps over time since
                the first step; none before WARM_STEPS steps past the first;
  first_step_s  launch to the first trained step, with the boot phases the agent reported;
  restart_s     the same, for an attempt that follows a reclaim: what a reclaim costs besides the redo;
  hours, reclaimed
                the attempt's hours and whether it was reclaimed: reclaims per hour per zone.

A batch job's worker measures each image it makes (its done markers' `seconds`, per image of a
batch): `learn_batch` keeps each worker host's images/s per GPU, its hours and its reclaim, so that
`offers` for a batch tier uses what workers measured as it does a training run's rate.
"""

from __future__ import annotations

import json
from typing import Any

from .records import put_observed

# Steps past the first that make an attempt warm: its rate stands for the rest of the job.
WARM_STEPS = 3


def steady_rate(costs: dict) -> float | None:
    """An attempt's steady steps/s from its ledger row; None until it is warm."""
    first, last = costs.get("start_step"), costs.get("last_step")
    if first is None or last is None or int(last) - int(first) < WARM_STEPS:
        return None
    if costs.get("it_per_s"):
        return float(costs["it_per_s"])
    span = float(costs.get("last_step_at") or 0.0) - float(costs.get("first_step_at") or 0.0)
    return (int(last) - int(first)) / span if span > 0 else None


def boot_phases(store, run_id: str, n: int) -> dict[str, float] | None:
    """The host's boot phases ({name: seconds}) from its boot report in the bucket; None where it wrote none."""
    try:
        doc = json.loads(store.get(f"runs/{run_id}/boot/attempt-{n}.json"))
    except Exception:  # noqa: BLE001 - local and SSH hosts write no boot report; a figure is best effort
        return None
    out: dict[str, float] = {}
    for p in doc.get("phases") or []:
        if isinstance(p, dict) and p.get("name") and isinstance(p.get("seconds"), (int, float)):
            out[str(p["name"])] = round(float(p["seconds"]), 3)
    return out or None


def learn(state, run_id: str, attempt: Any, *, tier: str, gpu: str, gpu_count: int, trainer: str, recipe: str,
          store=None) -> dict | None:
    """Keep what attempt `attempt` (ended) measured; the fields kept, or None where it measured nothing."""
    costs = state.attempt_costs(run_id).get(attempt.n) or {}
    rate = steady_rate(costs)
    first = costs.get("first_step_at")
    first_step_s = max(0.0, float(first) - attempt.start) if first is not None and attempt.start else None
    before = [a for a in state.attempts(run_id) if a.n < attempt.n]
    after_reclaim = bool(before) and before[-1].end_reason in ("preempted", "lost")
    if rate is None and first_step_s is None and attempt.end_reason not in ("preempted", "lost"):
        return None
    fields = dict(provider=attempt.provider or "", instance_type=attempt.instance_type or "", gpu=gpu,
                  gpu_count=max(1, gpu_count), tier=tier, trainer=trainer, recipe=recipe, zone=attempt.zone or "",
                  market=attempt.market or "", rate=rate, first_step_s=first_step_s,
                  phases=boot_phases(store, run_id, attempt.n) if store is not None else None,
                  restart_s=first_step_s if after_reclaim else None, hours=attempt.hours,
                  reclaimed=int(attempt.end_reason in ("preempted", "lost")))
    put_observed(state, run_id, attempt.n, **fields)
    return fields


def batch_rates(markers: list[dict]) -> dict[str, tuple[int, float]]:
    """Per worker, (images it made, seconds it spent making them) from a job's done markers; images
    an earlier attempt had made (`reused`) count for none."""
    out: dict[str, tuple[int, float]] = {}
    for m in markers:
        for line in m.get("images") or []:
            if line.get("reused") or not isinstance(line.get("seconds"), (int, float)) or line["seconds"] <= 0:
                continue
            n, secs = out.get(str(line.get("worker")), (0, 0.0))
            out[str(line.get("worker"))] = (n + 1, secs + float(line["seconds"]))
    return out


def learn_batch(state, job_id: str, attempt: Any, made: tuple[int, float] | None, *, tier: str, gpu: str,
                recipe: str) -> dict | None:
    """Keep what a batch job's worker host (`attempt`, ended) measured: images/s on its GPU (a worker
    drives one), its hours and whether it was reclaimed; None where it made nothing and was not reclaimed."""
    rate = made[0] / made[1] if made and made[0] >= WARM_STEPS and made[1] > 0 else None
    reclaimed = attempt.end_reason in ("preempted", "lost")
    if rate is None and not reclaimed:
        return None
    fields = dict(provider=attempt.provider or "", instance_type=attempt.instance_type or "", gpu=gpu, gpu_count=1,
                  tier=tier, trainer="", recipe=recipe, zone=attempt.zone or "", market=attempt.market or "",
                  rate=rate, first_step_s=None, phases=None, restart_s=None, hours=attempt.hours,
                  reclaimed=int(reclaimed))
    put_observed(state, job_id, attempt.n, **fields)
    return fields

