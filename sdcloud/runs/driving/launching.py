"""What a run's host is launched with: the agent config (with the dataset and the base model as the
host can read them: the bucket references runs/inputs/staging.py recorded, and how it ends itself), the
cloud's user-data, the host's environment.

A part of the Controller (runs/driving/controller.py), kept here so that the controller holds the run's
steps and this module what one launch carries.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from ...events import Kind
from ...providers.base import LaunchSpec
from ...providers.traits import Hosts, traits
from . import hostboot
from .agent_config import agent_config, self_end_config
from .owner import Memo
from ..inputs.spec import RunSpec
from ..records.state import StateStore


class LaunchInputs:
    """The Controller's launch side (a mixin: it reads the controller's run, store and memo)."""

    run_id: str
    spec: RunSpec
    state: StateStore
    store: Any
    store_conf: dict
    total_steps: int
    memo: Memo
    timing: Any
    _infra: dict
    event: Callable[[Kind, dict | None], None]
    cost_so_far: Callable[[], float]
    _job_hours: Callable[[], float]

    ensure_inputs: Callable[..., dict]

    def dataset_for_host(self) -> str | None:
        """The dataset as the host sees it: a local folder is in the run's bucket (runs/inputs/staging.py);
        a URL, or a folder that a host on this machine reads in place, is passed as it is."""
        return self.ensure_inputs().get("dataset")

    def model_for_host(self) -> str | None:
        """The base model as the host sees it: a local file or folder is in the bucket's cache/models/
        by its content (sdcloud.runs.inputs.models); the host gets its cache reference."""
        return self.ensure_inputs().get("model")

    def launch_spec(self, n: int) -> LaunchSpec:
        """What attempt `n`'s host is launched with: its agent config, user-data and environment."""
        agent = agent_config(self.spec, self.run_id, n, self.total_steps, self.store_conf,
                             reclaim_mean_hours=self.reclaim_mean_hours())
        agent["dataset"] = self.dataset_for_host()
        agent["model"] = self.model_for_host()
        agent["self_end"] = self.self_end_config()
        user_data = ""
        if traits(self.spec.provider).is_cloud:
            user_data = hostboot.cloud_user_data(self.spec.provider, self.store, agent, self._infra)
        env = {}
        if traits(self.spec.provider).hosts is Hosts.THIS_MACHINE:
            # Credentials for an S3 store reach a local host through its environment, never a file.
            env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "TENCENTCLOUD_"))}
        self.memo.launched_spec = LaunchSpec(run_id=self.run_id, attempt=n, user_data=user_data, agent_config=agent,
                                             infra=self._infra, env=env)
        return self.memo.launched_spec

    def reclaim_mean_hours(self) -> float | None:
        """The launched spot offer's mean time between reclaims: its band, sharpened by this run's
        reclaims in that zone (spot/checkpoint_spacing.py); None for on-demand."""
        offer = self.memo.launch_offer
        if offer is None or offer.band is None:
            return None
        from ...spot.checkpoint_spacing import zone_mean_hours

        return zone_mean_hours(offer.band, self.state.attempts(self.run_id), offer.row.zone or None)

    def self_end_config(self) -> dict:
        """How the host ends itself (agent_config.self_end_config), priced by the offer being launched."""
        offer = self.memo.launch_offer
        return self_end_config(self.spec, self.state.get_run(self.run_id)["created"],
                               offer.price_per_hour_usd if offer is not None else None, self.cost_so_far,
                               self.timing.poll_seconds, self._job_hours())
