"""Where a run is (`up --provider aws,tencent`): its placement, its clouds, and a move's copy.

The spot policy decides a move (spot/policy.py, `Sdcloud`): the fleet's candidates span the run's
clouds, each zone with its cloud, and the controller tells the policy which cloud holds the newest
checkpoint (`Observation.data_cloud`) and what a move there would add to a restart (`move_hours`,
`move_usd`), from the bytes the move carries as the stores hold them and the source's egress price
(offers/moves.py), at the rate this run's moves have measured (else the planning rate). The policy
answers a zone; one of another cloud is a move: the controller copies the newest complete
checkpoint and the run's inputs there (runs/driving/cloud_move.py: files first, manifest last),
then launches there. The rule is the one `sdcloud simulate` replays (docs/policies.md).

The run keeps ONE home store for its journal, driver lease and stop requests; a host in another
cloud is told that cloud's store (its own role signs there) for its checkpoints, status and the
controller's heartbeat, which the controller then reads and writes there.

The controller holds the run's `Placement` and changes it in one place (Controller.place); this
module holds what it reads to do so: the run's `Clouds` (their providers, stores and candidates),
the `Binding` of the run to one of them, and `carry`, the copy with its records.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol

from ...costs import ledger as cost_ledger
from ...errors import UserError
from ...events import Kind
from ...fleet.lifecycle import Across
from ...offers.moves import MoveCost, move_cost
from ...offers.optimizer import Offer
from ...offers.tiers import Tier
from ...providers import get_provider
from ...providers.base import ProviderError
from ...providers.loader import egress_price
from ...providers.traits import default_region, traits
from ..inputs.spec import RunPlan, RunSpec
from ..records.state import StateStore
from ..records.store import StoreError, open_run_store, store_config
from . import cloud_move, move_copy

# Copies of a move that never landed, after which the run keeps to the clouds it can reach.
MAX_MOVE_FAILURES = 3

Events = Callable[[Kind, dict], None]


@dataclass(frozen=True)
class Placement:
    """Where the run is: its cloud, the zone and capacity kind (spot, on-demand) of its newest launch
    (None before one), and the store that holds its newest checkpoint (its agent store config)."""

    cloud: str
    zone: str | None
    market: str | None
    store: dict


@dataclass(frozen=True)
class Home:
    """The run's home: the cloud it was made in, with the spec, stack outputs and store it was made with."""

    spec: RunSpec
    infra: dict
    store_conf: dict
    store: Any

    @property
    def cloud(self) -> str:
        return self.spec.provider


@dataclass(frozen=True)
class Binding:
    """The run bound to one of its clouds: what its launches, host status and fleet use there."""

    provider: Any
    spec: RunSpec
    plan: RunPlan
    infra: dict
    store_conf: dict
    store: Any


@dataclass
class MoveRecord:
    """What the controller keeps of its moves between steps (a driver started again learns each anew)."""

    failures: dict[str, int]  # per destination cloud: copies that never landed
    terms: tuple[tuple, Across] | None = None  # (what they were measured at, the terms), read once an attempt


class CandidatesOf(Protocol):
    """How the controller lists one cloud's candidates (fleet/candidates.py with the run's figures)."""

    def __call__(self, provider: Any, name: str, spec: RunSpec, plan: RunPlan) -> list[Offer]: ...


class Clouds:
    """The run's clouds, home first: each one's provider, stack outputs, store and candidates, made once."""

    def __init__(self, state: StateStore, run_id: str, home: Home, tier: Tier, given: dict[str, Any] | None = None):
        self.state, self.run_id, self.home, self.tier = state, run_id, home, tier
        self.names: list[str] = list(home.spec.providers or [home.cloud])
        self._providers: dict[str, Any] = dict(given or {})
        self._stores: dict[str, Any] = {home.cloud: home.store}
        self._offers: dict[str, list[Offer]] = {}
        self.moves = MoveRecord(failures={})

    @property
    def many(self) -> bool:
        return len(self.names) > 1

    def provider(self, name: str) -> Any:
        if name not in self._providers:
            self._providers[name] = get_provider(name)
        return self._providers[name]

    def infra(self, name: str) -> dict:
        if name == self.home.cloud:
            return self.home.infra
        return self.state.infra(name, "") or self.state.infra(name, default_region(name) or "") or {}

    def store_conf(self, name: str) -> dict:
        """The store a host in cloud `name` is told: the run's home store at home, else that cloud's bucket."""
        if name == self.home.cloud:
            return self.home.store_conf
        infra = self.infra(name)
        return store_config(name, None, infra.get("region") or default_region(name), infra)

    def store(self, name: str) -> Any:
        if name not in self._stores:
            self._stores[name] = open_run_store(self.store_conf(name))
        return self._stores[name]

    def spec_in(self, name: str) -> RunSpec:
        """The run's spec as launches in cloud `name` read it: away from home, the region of that cloud's
        stack, else its default (the catalog's first choice), and that cloud's bucket."""
        if name == self.home.cloud:
            return self.home.spec
        region = self.infra(name).get("region") or default_region(name)
        return replace(self.home.spec, provider=name, region=region, store=None)

    def binding(self, name: str) -> Binding:
        spec = self.spec_in(name)
        return Binding(self.provider(name), spec, RunPlan(spec, self.tier, traits(name)), self.infra(name),
                       self.store_conf(name), self.store(name))

    def elsewhere(self, here: str, listing: CandidatesOf) -> list[Offer]:
        """The candidates of the run's other clouds (listed once each; none for a cloud that a move's
        copy never reached MAX_MOVE_FAILURES times)."""
        out: list[Offer] = []
        for name in self.names:
            if name == here or self.moves.failures.get(name, 0) >= MAX_MOVE_FAILURES:
                continue
            if name not in self._offers:
                spec = self.spec_in(name)
                try:
                    self._offers[name] = listing(self.provider(name), name, spec, RunPlan(spec, self.tier, traits(name)))
                except (UserError, ProviderError):  # not reachable from here now (keys, its API): asked again later
                    continue
            out += self._offers[name]
        return out


def dataset_in(home_conf: dict, conf: dict, dataset: str | None) -> str | None:
    """The staged dataset's URL in the store `conf` (its key under the run is the same as at home)."""
    home = str(home_conf.get("url", "")).rstrip("/")
    if dataset and home and dataset.startswith(home + "/"):
        return str(conf["url"]).rstrip("/") + dataset[len(home):]
    return dataset


def carried_bytes(store: Any, run_id: str, inputs: dict | None) -> int:
    """The bytes a move from `store` carries, as it holds them (runs/driving/move_copy.py counts them)."""
    return move_copy.carried_bytes(store, run_id, inputs)


def measured_mb_s(state: StateStore, run_id: str) -> float | None:
    """The rate this run's landed moves kept (MB/s over their sent bytes), None before one sent a MB."""
    sent = [(int(e["data"].get("bytes") or 0), float(e["data"].get("seconds") or 0.0))
            for e in state.events(run_id) if e["kind"] is Kind.CLOUD_MOVED]
    nbytes, seconds = sum(b for b, _ in sent), sum(s for _, s in sent)
    return nbytes / 1e6 / seconds if nbytes >= 1e6 and seconds > 0 else None


def across(clouds: Clouds, placement: Placement, inputs: dict | None, attempts: int) -> Across | None:
    """What the policy is told of the run's clouds (None: one cloud): the checkpoint's cloud, and what a
    move from it adds to a restart, priced on what it carries now. Measured once an attempt (a store
    listing), and again when the checkpoint's cloud changes."""
    if not clouds.many:
        return None
    at = (placement.cloud, attempts)
    if clouds.moves.terms is not None and clouds.moves.terms[0] == at:
        return clouds.moves.terms[1]
    dst = next(n for n in clouds.names if n != placement.cloud)
    try:
        nbytes = carried_bytes(clouds.store(placement.cloud), clouds.run_id, inputs)
    except StoreError:
        nbytes = 0  # a store fault now: the move priced on its inputs' record next attempt
    cost = move_cost(placement.cloud, dst, nbytes, transfer_mb_s=measured_mb_s(clouds.state, clouds.run_id),
                     egress=egress_price(placement.cloud, clouds.spec_in(placement.cloud).region))
    terms = Across(placement.cloud, cost.transfer_hours, cost.egress_usd)
    clouds.moves.terms = (at, terms)
    return terms


def carry(clouds: Clouds, src: str, dst: str, inputs: dict | None, events: Events, why: str) -> bool:
    """Copy the run's newest complete checkpoint and its inputs from cloud `src`'s store to `dst`'s
    (files first, the manifest last), price and record it. False when the copy did not land: the run
    stays where it is, and the next try sends only what is missing."""
    src_region = clouds.spec_in(src).region
    copied, error = cloud_move.carry_copy(clouds.state, clouds.run_id, src, src_region, clouds.store(src),
                                          clouds.store(dst), inputs)
    if copied is None:
        clouds.moves.failures[dst] = clouds.moves.failures.get(dst, 0) + 1
        events(Kind.CLOUD_MOVE_FAILED, {"from": src, "to": dst, "error": error,
                                        "failures": clouds.moves.failures[dst]})
        return False
    cost: MoveCost = move_cost(src, dst, copied.sent, egress=egress_price(src, src_region))
    events(Kind.CLOUD_MOVED, {"from": src, "to": dst, "why": why, "step": copied.step,
                              "bytes": copied.sent, "skipped": copied.skipped, "seconds": copied.seconds,
                              "egress_usd": cost.egress_usd, "transfer_hours": round(cost.transfer_hours, 6),
                              "reason": cost.reason, "by_host": copied.by_host})
    if not copied.by_host:  # a host's copy is recorded from its report, as it paid it (settle_host_copy)
        cost_ledger.record_move(clouds.state, clouds.run_id, src, copied.fetched or copied.sent, copied.seconds,
                                region=src_region)
    return True


__all__ = ["Binding", "Clouds", "Home", "MAX_MOVE_FAILURES", "MoveRecord", "Placement", "across", "carried_bytes",
           "carry", "dataset_in", "measured_mb_s"]
