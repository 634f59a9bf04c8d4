"""What a run's host is launched with: the agent config (with the dataset and the base model as the
host can read them: the bucket references runs/inputs/staging.py recorded, and how it ends itself), the
cloud's user-data, the host's environment.

The Controller (runs/driving/controller.py) holds one LaunchInputs (`ctl.launching`), so that the
controller holds the run's steps and this module what one launch carries; what it reads of the
controller is LaunchOwner.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from ...offers.groups import node_count
from ...providers.base import LaunchSpec
from ...providers.traits import Hosts
from . import hostboot
from ..inputs.agent_config import agent_config, self_end_config
from .owner import Memo
from .run_row import RunRow
from ..inputs.spec import RunPlan, RunSpec
from ..records.state import StateStore


class LaunchOwner(Protocol):
    """What LaunchInputs reads of the controller that holds it, when a launch is made (not copied:
    a store or stack outputs the controller changes later are the ones the next launch sees)."""

    run_id: str
    spec: RunSpec
    plan: RunPlan  # the spec with its tier and provider traits resolved (runs/inputs/spec.py)
    row: RunRow  # the run's row, read once a step (run_row.py)
    state: StateStore
    store: Any
    store_conf: dict
    total_steps: int
    memo: Memo
    timing: Any

    @property
    def infra(self) -> dict: ...

    def cost_so_far(self) -> float: ...

    def expected_job_hours(self) -> float: ...

    def ensure_inputs(self, drive: str | None = None) -> dict: ...


class LaunchInputs:
    """The Controller's launch side: what attempt n's host is launched with."""

    def __init__(self, owner: LaunchOwner):
        self.owner = owner

    def dataset_for_host(self) -> str | None:
        """The dataset as the host sees it: a local folder is in the run's bucket (runs/inputs/staging.py);
        a URL, or a folder that a host on this machine reads in place, is passed as it is."""
        return self.owner.ensure_inputs().get("dataset")

    def model_for_host(self) -> str | None:
        """The base model as the host sees it: a local file or folder is in the bucket's cache/models/
        by its content (sdcloud.runs.inputs.models); the host gets its cache reference."""
        return self.owner.ensure_inputs().get("model")

    def launch_spec(self, n: int) -> LaunchSpec:
        """What attempt `n`'s host is launched with: its agent config, user-data and environment."""
        own = self.owner
        agent = agent_config(own.plan, own.run_id, n, own.total_steps, own.store_conf,
                             reclaim_mean_hours=self.reclaim_mean_hours())
        agent["dataset"] = self.dataset_for_host()
        agent["model"] = self.model_for_host()
        agent["self_end"] = self.self_end_config()
        user_data, node_user_data = "", []
        nodes = node_count(agent)
        if own.plan.traits.is_cloud:
            # A multi-node group (providers/groups.py) launched in one request: one user-data for every
            # host, each taking its rank from its launch index; launched host by host: each rank's own.
            user_data = hostboot.cloud_user_data(own.spec.provider, own.store,
                                                 {**agent, "node_rank_from": "launch-index"} if nodes > 1 else agent,
                                                 own.infra)
            node_user_data = [hostboot.cloud_user_data(own.spec.provider, own.store, {**agent, "node_rank": rank},
                                                       own.infra) for rank in range(nodes)] if nodes > 1 else []
        env = {}
        if own.plan.traits.hosts is Hosts.THIS_MACHINE:
            # Credentials for an S3 store reach a local host through its environment, never a file.
            env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "TENCENTCLOUD_"))}
        own.memo.launched_spec = LaunchSpec(run_id=own.run_id, attempt=n, user_data=user_data, agent_config=agent,
                                            infra=own.infra, env=env,
                                            node_user_data=node_user_data)
        return own.memo.launched_spec

    def reclaim_mean_hours(self) -> float | None:
        """The launched spot offer's mean time between reclaims: its band, sharpened by this run's
        reclaims in that zone (spot/checkpoint_spacing.py); None for on-demand."""
        offer = self.owner.memo.launch_offer
        if offer is None or offer.band is None:
            return None
        from ...spot.checkpoint_spacing import zone_mean_hours

        return zone_mean_hours(offer.band, self.owner.state.attempts(self.owner.run_id), offer.row.zone or None)

    def self_end_config(self) -> dict:
        """How the host ends itself (agent_config.self_end_config), priced by the offer being launched."""
        own = self.owner
        offer = own.memo.launch_offer
        return self_end_config(own.spec, own.row.get()["created"],
                               offer.price_per_hour_usd if offer is not None else None, own.cost_so_far,
                               own.timing.poll_seconds, own.expected_job_hours())
