"""The Provider protocol every cloud (and the local and SSH hosts) sits behind.

Every instance a provider launches carries the tags `sdcloud:run`, `sdcloud:attempt` and
`sdcloud:token`, so that a controller that crashed can always find, adopt or reap it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Protocol, runtime_checkable

from ..errors import UserError
from ..offers.groups import node_count
from ..offers.optimizer import Offer

TAG_RUN = "sdcloud:run"
TAG_ATTEMPT = "sdcloud:attempt"
TAG_TOKEN = "sdcloud:token"
TAG_NODE = "sdcloud:node"  # a multi-node group's host: its rank (providers/groups.py)
TAG_NODES = "sdcloud:nodes"  # ...and the group's size: a crash mid-launch leaves fewer, never adopted as whole

# Instance states, normalised across providers.
PENDING, RUNNING, STOPPING, TERMINATED, FAILED = "pending", "running", "stopping", "terminated", "failed"
# A marketplace host outbid (MarketRules.pauses): stopped with its disk, billed, resumable on the same machine.
PAUSED = "paused"
LIVE_STATES = (PENDING, RUNNING, STOPPING, PAUSED)


def launch_token(run_id: str, attempt: int) -> str:
    """Idempotency token for one attempt of a run: the same run and attempt give the same token."""
    return "sdc-" + hashlib.sha256(f"{run_id}/{attempt}".encode()).hexdigest()[:32]


@dataclass
class LaunchSpec:
    """What to start on the host: the agent's config (no secrets) and the user-data that starts it."""

    run_id: str
    attempt: int
    user_data: str = ""
    agent_config: dict = field(default_factory=dict)
    root_volume_gb: int = 200
    ssh_key_name: str | None = None
    # Outputs of the provider's Pulumi stack (launch template, subnets, security group, role), if any.
    infra: dict = field(default_factory=dict)
    # Extra environment for hosts that run on this machine (local provider): never written to disk.
    env: dict = field(default_factory=dict)
    # A multi-node group (providers/groups.py): each rank's user-data, rank 0's first; and, in the
    # spec of one host of the group, its rank (None: the whole group, or a single host).
    node_user_data: list[str] = field(default_factory=list)
    node: int | None = None

    @property
    def token(self) -> str:
        return launch_token(self.run_id, self.attempt)

    @property
    def launch_key(self) -> str:
        """The idempotency key of one host's launch: the token, and the rank of a group's host."""
        return self.token if self.node is None else f"{self.token}-n{self.node}"

    @property
    def tags(self) -> dict[str, str]:
        tags = {TAG_RUN: self.run_id, TAG_ATTEMPT: str(self.attempt), TAG_TOKEN: self.token}
        if self.node is not None:
            tags[TAG_NODE] = str(self.node)
            tags[TAG_NODES] = str(node_count(self.agent_config))
        return tags


@dataclass
class Instance:
    provider: str
    id: str
    region: str
    zone: str
    instance_type: str
    market: str  # "spot" or "on-demand"
    state: str  # one of PENDING, RUNNING, STOPPING, TERMINATED, FAILED
    price_per_hour: float | None = None  # max price for spot when known, else the list price
    public_ip: str | None = None
    private_ip: str | None = None
    launched_at: datetime | None = None
    tags: dict[str, str] = field(default_factory=dict)
    adopted: bool = False  # True when launch() found an instance with the same token instead of launching

    @property
    def run_id(self) -> str | None:
        return self.tags.get(TAG_RUN)

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


class ProviderError(Exception):
    """A provider call failed in a way the controller may act on."""


class CapacityError(ProviderError):
    """No capacity for this type in this zone (move on to the next zone, then the next offer)."""


class PriceTooLowError(ProviderError):
    """The max price is below the current spot price."""

    def __init__(self, message: str, current_price: float | None = None):
        super().__init__(message)
        self.current_price = current_price


class QuotaError(UserError):
    """An account quota blocks the launch: stop and tell the user which quota and how to raise it."""


class CredentialsError(UserError):
    """No credentials found for the provider."""


# Every retry, failover and adoption is reported through this, to be recorded as a run event.
EventSink = Callable[[str, dict], None]


def no_events(kind: str, data: dict) -> None:
    return None


@runtime_checkable
class Provider(Protocol):
    name: str

    def offers(self, tier, market: str | None = None, regions: list[str] | None = None) -> list[Offer]: ...

    def launch(self, offer: Offer, spec: LaunchSpec, market: str, max_price: float | None = None,
               events: EventSink = no_events) -> Instance:
        """Start one host for `spec`, or adopt the live one that carries `spec.token`.

        Tries the offer's zone (or every zone of its region when the offer has none) and raises
        CapacityError only when every zone is out of capacity.
        """
        ...

    def describe(self, ids: list[str], region: str | None = None) -> list[Instance]: ...

    def terminate(self, ids: list[str], region: str | None = None) -> None: ...

    def find_tagged(self, run_id: str | None = None, regions: list[str] | None = None) -> list[Instance]:
        """Live instances carrying `sdcloud:run` (= run_id when given)."""
        ...

    def price_history(self, instance_type: str, zone: str, start: datetime, end: datetime) -> list[tuple[datetime, float]]: ...
