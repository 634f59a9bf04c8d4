"""What a run's host agent is told for one attempt: the agent config (sdcloud_agent's config.json).

The run's plan (runs/inputs/spec.py's RunPlan: the spec and its tier, resolved once) gives what to
train and how often to save; the provider's declared host traits (the plan's `traits.host`) give
what the machine is: local NVMe to prepare, a GPU required, which reclaim notice to watch, how often
to beat and poll. `self_end` is how a host ends itself when nobody drives the run
(sdcloud_agent/selfend.py). It sits with the run's inputs: the controller launches with it, and
staging records it. No secrets: credentials come from the instance role or the environment.
"""

from __future__ import annotations

import time
from typing import Any

from ... import config
from ...offers.groups import group_price, node_count
from ..inputs.spec import RunPlan, RunSpec

# The port rank 0 of a multi-node group listens on (torch.distributed's default).
RENDEZVOUS_PORT = 29500
# Polls without the controller's heartbeat after which a host counts the run as unattended.
UNATTENDED_POLLS = 4


def self_end_grace(spec: RunSpec) -> float:
    """Seconds a finished host waits for the controller: the run's own, else config.toml's, else 10 min."""
    if spec.self_end_grace is not None:
        return float(spec.self_end_grace)
    return config.self_end_grace()


def _trainer_args(plan: RunPlan) -> Any:
    # The tier's flags for the trainer under the user's; a mapping stays a mapping (runs/inputs/training.py).
    from ..inputs.training import trainer_args_for

    return trainer_args_for(plan.spec, plan.tier)


def agent_config(plan: RunPlan, run_id: str, attempt: int, total_steps: int, store_conf: dict,
                 reclaim_mean_hours: float | None = None) -> dict:
    """The agent's config for one attempt (no secrets: credentials come from the instance role or env).
    `reclaim_mean_hours`: the spot zone's mean time between reclaims (spot/checkpoint_spacing.py), sent
    with the provider's notice so that the host can space its checkpoints by the risk."""
    from ..inputs.samples import agent_samples, keep_sampled
    from ..inputs.training import resolution_from_model

    spec, tier, host = plan.spec, plan.tier, plan.traits.host
    return {
        "run_id": run_id,
        "attempt": attempt,
        "tier": tier.name,
        "min_vram_gb": tier.min_vram_gb,
        "rec_vram_gb": tier.rec_vram_gb,
        "trainer": spec.trainer,
        "trainer_args": _trainer_args(plan),
        # The host settles the resolution from the model's config when the user did not give one.
        "resolution_from_model": resolution_from_model(spec),
        "model": spec.model,
        "steps": total_steps,
        "checkpoint_every": spec.checkpoint_every or max(1, min(500, total_steps // 8 or 1)),
        "keep_checkpoints": 3,
        "store": store_conf,
        "dataset": spec.dataset,
        "nvme": host.nvme,
        "require_gpu": host.gpu_required,
        # Which reclaim notice the host watches; the local provider points it at its own endpoint.
        "metadata": {"kind": host.metadata},
        "heartbeat_seconds": host.heartbeat_seconds,
        "poll_seconds": host.poll_seconds,
        # The run's own mirrors; the host's region and config.toml add theirs at launch (hostboot.py).
        **({"network": dict(spec.network)} if spec.network else {}),
        **({"reclaim_notice_seconds": plan.traits.timing.reclaim_notice_seconds,
            "reclaim_mean_seconds": round(reclaim_mean_hours * 3600)}
           if reclaim_mean_hours is not None and spec.market == "spot" else {}),
        # A multi-node group (sdcloud_agent/rendezvous.py): every host gets the same config but its
        # rank, which its launch sets (the provider: one config per host); rank 0 publishes the port.
        "nodes": spec.nodes,
        "node_rank": 0,
        "rendezvous_port": RENDEZVOUS_PORT,
        # Sample images at the checkpoints and the trainer's curve logging (runs/inputs/samples.py).
        **({"samples": samples, "keep_sampled": keep_sampled()} if (samples := agent_samples(spec)) else {}),
        **({"report_to": spec.report_to} if spec.report_to else {}),
    }


def self_end_config(spec: RunSpec, created: float, price_per_hour: float | None, spent: Any,
                    poll_seconds: float, estimate_hours: float) -> dict:
    """How the host ends itself (sdcloud_agent/selfend.py): the grace, when the run counts as
    unattended, and the figures of its lifetime cap (this host's price, the budget left, the
    deadline, the estimate). `spent` is called only when the run has a budget."""
    budget_left = None if spec.budget is None else max(0.0, spec.budget - spent())
    price_per_hour = group_price(price_per_hour, node_count(spec))  # every host of a group guards the group's burn
    deadline_at = created + spec.deadline_hours * 3600 if spec.deadline_hours else None
    return {"provider": spec.provider, "grace_s": self_end_grace(spec),
            # A few polls without the controller's heartbeat: nobody drives the run.
            "unattended_after_s": UNATTENDED_POLLS * poll_seconds,
            "price_per_hour": round(price_per_hour, 6) if price_per_hour is not None else None,
            "budget_left": None if budget_left is None else round(budget_left, 4),
            "deadline_at": None if deadline_at is None else round(deadline_at),
            "estimate_hours": round(estimate_hours, 3), "launched_at": round(time.time(), 1),
            "region": spec.region}
