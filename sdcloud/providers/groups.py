"""A multi-node group's hosts as one instance (`up --nodes N`), for every cloud provider.

The fleet and the controller keep one attempt per group, so a group is one `Instance` whose id is
its `Group`'s: its hosts' ids joined by GROUP_SEP, rank 0's first ("i-0a+i-0b"), at the group's
price. `describe` of that id is the
group's state: live while every host is, gone (or failed) as soon as one is, so that a reclaim of
any host ends the attempt; `terminate` of it ends every host. A group is one unit: all its hosts in
one zone and one market. A provider launches it in one request where its cloud can (AWS: RunInstances
with MinCount = MaxCount = N, each host's rank its launch index), or host by host (launch_group below:
rank 0 wherever the zone failover puts it, the others follow it there; a host that cannot be launched
ends the hosts already up before the error goes on).

Each host carries the group's `sdcloud:token` (the sweep of strays keeps the group) and its rank in
`sdcloud:node`; its launch is idempotent on `LaunchSpec.launch_key` (token and rank), so a
controller that crashed mid-launch adopts the ranks already up and launches the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol, runtime_checkable

from ..offers.groups import group_price, node_count
from ..offers.optimizer import Offer
from ..errors import UserError
from .base import (FAILED, LIVE_STATES, PENDING, STOPPING, TAG_NODE, TAG_NODES, TERMINATED, EventSink, Instance,
                   LaunchSpec, ProviderError)

GROUP_SEP = "+"


@runtime_checkable
class SweepsGroupLeftovers(Protocol):
    """`sdcloud gc`: what a group leaves beside its hosts (free, but clutter) deleted once its run is over."""

    def sweep_group_leftovers(self, regions: list[str] | None, is_active: Callable[[str], bool]) -> list[str]: ...


def check_group(name: str, nodes: int) -> None:
    """Refuse, before anything is made, a group provider `name` cannot launch: one without the power
    (capabilities.LaunchesGroups: the user's own boxes, one run a box), or one larger than its limit
    (this machine: a host per CPU core, and per GPU where it has GPUs)."""
    from .capabilities import LaunchesGroups
    from .loader import provider_class

    if nodes <= 1:
        return
    cls = provider_class(name)
    if not issubclass(cls, LaunchesGroups):
        raise UserError(f"--nodes {nodes}: the {name} provider runs each run on one box of yours; a group of "
                        f"hosts needs a cloud provider or the local one")
    limit = cls.group_limit()
    if limit is not None and nodes > limit[0]:
        most, why = limit
        raise UserError(f"--nodes {nodes}: the {name} provider can run at most {most} hosts of a group here "
                        f"({why}); use --nodes {most} or less, or a cloud provider")


@dataclass(frozen=True)
class Group:
    """A multi-node group as one value: its hosts' ids in rank order, how many hosts it has, and one
    host's price per hour. Its `id` is what the fleet and the attempt rows keep ("i-0a+i-0b"), its
    `price` the group's (offers.groups.group_price, the one group price)."""

    hosts: tuple[str, ...]
    nodes: int
    host_price: float | None = None

    @property
    def id(self) -> str:
        return GROUP_SEP.join(self.hosts)

    @property
    def price(self) -> float | None:
        return group_price(self.host_price, self.nodes)

    @classmethod
    def of_id(cls, instance_id: str, host_price: float | None = None) -> "Group":
        hosts = tuple(i for i in instance_id.split(GROUP_SEP) if i)
        return cls(hosts, len(hosts), host_price)


def nodes_of(spec: LaunchSpec) -> int:
    """The hosts a launch spec asks for (its agent config's `nodes`)."""
    return node_count(spec.agent_config or {})


def is_group_launch(spec: LaunchSpec) -> bool:
    """Whether `spec` asks for a whole group (not one host of one)."""
    return nodes_of(spec) > 1 and spec.node is None


def group_id(ids: list[str]) -> str:
    return Group(tuple(ids), len(ids)).id


def members(instance_id: str) -> list[str]:
    return list(Group.of_id(instance_id).hosts)


def has_group(ids: list[str]) -> bool:
    return any(GROUP_SEP in i for i in ids)


def expand(ids: list[str]) -> list[str]:
    return [m for i in ids for m in members(i)]


def host_spec(spec: LaunchSpec, rank: int) -> LaunchSpec:
    """The spec of rank `rank`'s host: its own user-data and rank in the agent config."""
    user_data = spec.node_user_data[rank] if spec.node_user_data else spec.user_data
    return replace(spec, user_data=user_data, node=rank, node_user_data=[],
                   agent_config={**spec.agent_config, "node_rank": rank})


def combine(hosts: list[Instance], nodes: int | None = None) -> Instance:
    """One Instance for the group's hosts (rank order): live only while all `nodes` of them are."""
    first = hosts[0]
    states = [h.state for h in hosts]
    if nodes is not None and len(hosts) < nodes:
        state = TERMINATED  # a host the cloud no longer knows is gone
    elif FAILED in states:
        state = FAILED
    elif any(s not in LIVE_STATES for s in states):
        state = next(s for s in states if s not in LIVE_STATES)
    elif STOPPING in states and any(s != STOPPING for s in states):
        state = TERMINATED  # a host shutting down (reclaimed) while the others run: the group is no longer whole
    elif PENDING in states:
        state = PENDING
    else:
        state = first.state
    prices = {h.price_per_hour for h in hosts}  # one offer: every host at its price
    group = Group(tuple(h.id for h in hosts), len(hosts), first.price_per_hour if None not in prices else None)
    return replace(first, id=group.id, state=state, price_per_hour=group.price, adopted=all(h.adopted for h in hosts))


def rank_of(inst: Instance) -> int:
    try:
        return int(inst.tags.get(TAG_NODE, "0"))
    except ValueError:
        return 0


def adopt_found(found: list[Instance]) -> Instance:
    """The instances a token finds (a group's hosts, or one host) as one Instance, in rank order; a
    group with fewer hosts than its `sdcloud:nodes` (a launch cut short) is not live."""
    try:
        nodes = int(found[0].tags.get(TAG_NODES, "0") or 0)
    except ValueError:
        nodes = 0
    if len(found) == 1 and nodes <= 1:
        return found[0]
    return combine(sorted(found, key=rank_of), max(nodes, len(found)))


def launch_group(provider: Any, launch_one: Callable[..., Instance], offer: Offer, spec: LaunchSpec, market: str,
                 max_price: float | None, events: EventSink) -> Instance:
    """Launch every host of the group through the provider's one-host `launch_one`, in one zone."""
    nodes = nodes_of(spec)
    first = launch_one(offer, host_spec(spec, 0), market, max_price, events)
    pinned = Offer(replace(offer.row, zone=first.zone or offer.row.zone), offer.market)
    hosts = [first]
    try:
        for rank in range(1, nodes):
            hosts.append(launch_one(pinned, host_spec(spec, rank), market, max_price, events))
    except BaseException:
        # One unit: a group that cannot be whole is not left half up.
        try:
            provider.terminate([h.id for h in hosts], region=offer.row.region)
        except ProviderError:
            pass
        raise
    return combine(hosts, nodes)


def describe_groups(describe: Callable[[list[str], str | None], list[Instance]], ids: list[str],
                    region: str | None) -> list[Instance]:
    """`describe` over ids of which some are groups: each group's hosts described and combined."""
    found = {i.id: i for i in describe(expand(ids), region)}
    out = []
    for one in ids:
        hosts = [found[m] for m in members(one) if m in found]
        if GROUP_SEP not in one:
            out.extend(hosts)
        elif hosts:
            out.append(combine(hosts, len(members(one))))
    return out
