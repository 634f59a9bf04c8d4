"""Groups of N same-type hosts training one run together (`--nodes N`), and what they are worth.

A group is priced as one unit: N x the host's price, one restart cost, and it is reclaimed when any
one of its hosts is (the reclaim rate of one host x N). Its speed is the multi-node model below,
documented in docs/training.md ("Multi-node: offers, stacks and costs"):

    step_1 = 1 / rate                             one host's step (offers/rates.py or a measured rate)
    grads  = trained parameters x 2 bytes         the all-reduce payload of one step (bf16 gradients)
    link   = min(line rate, flows x single-flow cap) x socket efficiency     bytes/s between two hosts
    comm   = 2 (N - 1) / N x grads / link         a ring all-reduce (each host sends and receives this)
    step_N = step_1 + max(0, comm - overlap x step_1)   DDP overlaps the all-reduce with the backward pass
    speed-up = N x step_1 / step_N                the group's rate is the host's x speed-up

Where each figure comes from:
- the line rate per instance type is the provider's network trait (`interconnect.csv` in its folder,
  parsed by providers/loader.py), each row citing its page; a type missing there is assumed at
  DEFAULT_GBPS; a type with several network cards counts one card's share (one interface attached);
- the single-flow cap and the flows, the provider's network trait too: EC2 lets one TCP flow reach
  10 Gbps inside a cluster placement group and 5 Gbps outside one (EC2 User Guide, "Amazon EC2
  instance network bandwidth"); NCCL's socket transport opens NCCL_SOCKET_NTHREADS x
  NCCL_NSOCKS_PERTHREAD flows (16 on AWS); a provider that declares none is assumed at DEFAULT_FLOW_GBPS;
- SOCKET_EFFICIENCY, OVERLAP and BYTES_PER_PARAM are assumptions (stated in --explain); step_1 is the
  host's rate as for one host, so a measured or recorded host rate (`sdcloud speeds`) feeds the model.
  sdcloud does not attach EFA interfaces: a type that has EFA runs NCCL over TCP here too, at its ENA
  line rate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from ..errors import UserError
from . import told
from .catalog import BAND_RECLAIMS_PER_HOUR, Catalog
from .kinds import RunKind
from .optimizer import CHECKPOINT_INTERVAL_HOURS, RESTART_HOURS, SETUP_HOURS, Estimate, offer_rate, rank
from .tiers import Tier

# Hosts in one group: the same bound `up --nodes` checks (runs/inputs/spec.py).
MAX_NODES = 64
DEFAULT_GBPS = 5.0  # a type no interconnect.csv lists (assumed)
# One TCP flow's rate and the flows between two hosts where the provider declares none (assumed: EC2's
# figure outside a placement group; NCCL's socket defaults on AWS). A provider's own are its traits'.
DEFAULT_FLOW_GBPS = 5.0
DEFAULT_FLOWS = 16
SOCKET_EFFICIENCY = 0.6  # assumed: NCCL over TCP sockets reaches about this share of the flows' rate
OVERLAP = 0.5  # assumed: the share of a step's compute that hides the all-reduce (the backward pass)
# bf16 gradients: kohya's --full_bf16 and accelerate's bf16 communication hook all-reduce 2 bytes a parameter;
# a trainer that all-reduces fp32 gradients doubles the all-reduce term (assumption, stated in --explain).
BYTES_PER_PARAM = 2
# Parameters the tier's trainer updates, by family (the denoiser alone; text encoders frozen):
# SD 1.5 UNet 860M (Rombach et al. 2022), SDXL UNet 2.6B (Podell et al. 2023), SD3.5 Medium MMDiT 2.5B
# and Large 8.1B (Stability AI's model cards); a LoRA's adapters at rank 32 are under 2% of that.
FAMILY_PARAMS = {"sd15": 0.86e9, "sd2": 0.87e9, "sdxl": 2.6e9, "sd3": 2.5e9}
LARGE_PARAMS = 8.1e9  # SD3.5 Large (tiers whose name says sd35l)
LORA_SHARE = 0.02


def group_price(host_price: float | None, nodes: int) -> float | None:
    """The one price of a group per hour: its `nodes` hosts, of one type, market and zone, each billed
    the host's price (None where the host's is unknown). Every group price in sdcloud is this one."""
    return None if host_price is None else host_price * max(1, int(nodes))


def node_count(spec: Any) -> int:
    """The hosts of each attempt, from whatever carries `nodes`: a RunSpec, a run row's spec (a dict),
    an agent config (a dict) or a LaunchSpec's agent config; 1 where it says nothing usable."""
    value = spec.get("nodes") if isinstance(spec, Mapping) else getattr(spec, "nodes", None)
    try:
        return max(1, int(value or 1))
    except (TypeError, ValueError):
        return 1


@dataclass(frozen=True)
class Link:
    """The network between two hosts of one type, and how a group of them is placed. `gbps` is what one
    host's interface carries: sdcloud attaches one interface (on network card 0), so a type whose
    listed figure is summed over several network cards (p4d: 4, p5.48xlarge: 32) counts one card's share."""

    gbps: float
    basis: str  # listed, baseline, assumed
    placement: str  # "cluster" (a cluster placement group) or "zone" (the same zone, nothing closer)
    source: str
    host_gbps: float | None = None  # the whole host's listed figure, over all its network cards
    cards: int = 1
    flow_gbps: float = DEFAULT_FLOW_GBPS  # one TCP flow's cap at this placement (the provider's network trait)
    flows: int = DEFAULT_FLOWS  # TCP flows between two hosts
    flow_source: str = "assumed"


@dataclass(frozen=True)
class GroupEstimate:
    """A group of `nodes` hosts of one offer: its price, speed-up and expected cost to finish."""

    host: Estimate  # the one-host estimate of the same offer
    nodes: int
    speedup: float
    link: Link
    est_hours: float
    est_cost: float
    overhead: float

    @property
    def offer(self):  # the host's offer, N times: where an Estimate is read (costs/budget.py, the checks of `up`)
        return self.host.offer

    @property
    def price_per_hour_usd(self) -> float:
        return group_price(self.host.offer.price_per_hour_usd, self.nodes) or 0.0

    @property
    def efficiency(self) -> float:
        return self.speedup / self.nodes

    def as_dict(self) -> dict:
        d = self.host.as_dict()
        d.update({"nodes": self.nodes, "host_price_per_hour_usd": d["price_per_hour_usd"],
                  "price_per_hour_usd": round(self.price_per_hour_usd, 4),
                  "est_hours": round(self.est_hours, 3), "est_cost": round(self.est_cost, 4),
                  "overhead": round(self.overhead, 4), "speedup": round(self.speedup, 3),
                  "scaling_efficiency": round(self.efficiency, 3),
                  "rate": round(d["rate"] * self.speedup, 4) if d.get("rate") else None,
                  "placement": "cluster placement group" if self.link.placement == "cluster" else "one zone",
                  "network_gbps": self.link.gbps, "network_basis": self.link.basis, "network_source": self.link.source,
                  "network_cards": self.link.cards, "host_network_gbps": self.link.host_gbps or self.link.gbps})
        return d


def check_nodes(tier: Tier, nodes: int, flag: str = "--nodes") -> int:
    """A group size the tier takes: a whole number 1..MAX_NODES, more than 1 only for training tiers."""
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise UserError(f"{flag} must be a positive whole number, got {nodes!r}")
    if nodes > MAX_NODES:
        raise UserError(f"{flag} {nodes}: at most {MAX_NODES} hosts train together")
    if nodes > 1 and tier.kind is not RunKind.TRAIN:
        raise UserError(f"{flag} {nodes}: tier {tier.name} makes images; only training tiers run on several "
                        f"hosts (a batch job spreads over workers: sdcloud batch submit --workers N)")
    return nodes


# Each provider's network facts, as its traits declare them (providers/loader.py parses the file in
# the provider's folder): offers sit below providers, so they are told, when the provider is registered,
# how to read its table. A provider that declares none gets the assumed DEFAULT_GBPS.
_LINK_TABLES: dict[str, Callable[[], dict[str, Link]]] = {}


def tell_links(provider: str, table: Callable[[], dict[str, Link]]) -> None:
    """Called by the provider's registration (providers/traits.py): `table()` gives its links by type."""
    _LINK_TABLES[provider] = cache(table)


def forget_links(provider: str) -> None:
    _LINK_TABLES.pop(provider, None)


def link_of(provider: str, instance_type: str) -> Link:
    """The link between two hosts of `instance_type` (the provider's row "*" for every type it does not list)."""
    if provider not in _LINK_TABLES:
        told.ask(provider)  # its traits read now: they tell its network facts (offers/told.py)
    known = _LINK_TABLES.get(provider)
    table = known() if known is not None else {}
    found = table.get(instance_type) or table.get("*")
    return found or Link(DEFAULT_GBPS, "assumed", "zone", f"no interconnect figure for {provider}; assumed")


def trained_params(tier: Tier) -> float:
    full = LARGE_PARAMS if "sd35l" in tier.name else FAMILY_PARAMS.get(tier.family, FAMILY_PARAMS["sdxl"])
    return full * (LORA_SHARE if tier.mode == "lora" else 1.0)


def speedup(tier: Tier, rate: float, nodes: int, link: Link) -> float:
    """The model above: a group of `nodes` hosts against one host, whose rate is `rate` steps/s."""
    if nodes <= 1:
        return 1.0
    step = 1.0 / rate
    bytes_per_s = min(link.gbps, link.flows * link.flow_gbps) * 1e9 / 8 * SOCKET_EFFICIENCY
    comm = 2 * (nodes - 1) / nodes * trained_params(tier) * BYTES_PER_PARAM / bytes_per_s
    return nodes * step / (step + max(0.0, comm - OVERLAP * step))


def job_hours_on(tier: Tier, row, job_size: int | None, nodes: int, gpus_used: int | None = None,
                 book=None) -> float | None:
    """optimizer.job_hours for a group of `nodes` hosts of `row` (its speed-up); None if the GPU is unknown."""
    rate = offer_rate(tier, row, gpus_used, book)
    if rate is None:
        return None
    up = speedup(tier, rate.value, nodes, link_of(row.provider, row.instance_type))
    return SETUP_HOURS + (job_size or tier.job_size) / (rate.value * up) / 3600.0


def group_estimate(tier: Tier, host: Estimate, nodes: int, job_size: int | None = None) -> GroupEstimate | None:
    if host.rate is None:
        return None
    r = host.offer.row
    link = link_of(r.provider, r.instance_type)
    up = speedup(tier, host.rate.value, nodes, link)
    hours = SETUP_HOURS + (job_size or tier.job_size) / (host.rate.value * up) / 3600.0
    band = host.offer.band
    # Any host's reclaim stops the group: N hosts are reclaimed N times as often, each costing one restart.
    overhead = 1.0 if band is None else 1.0 + nodes * BAND_RECLAIMS_PER_HOUR[band] * (
        RESTART_HOURS + CHECKPOINT_INTERVAL_HOURS / 2)
    price = group_price(host.offer.price_per_hour_usd, nodes) or 0.0
    return GroupEstimate(host, nodes, up, link, hours * overhead, price * hours * overhead, overhead)


def rank_groups(tier: Tier, catalog: Catalog, nodes: int, job_size: int | None = None, keep_slower: bool = False,
                **filters) -> list[GroupEstimate]:
    """Groups of `nodes` same-type hosts (one zone), cheapest expected cost to finish first.

    `filters` are rank()'s (market, max_price per host, provider, region, book). A group the model
    finds no faster than one host of its type (its network cannot carry the all-reduce) is left out,
    unless every group is such and `keep_slower`: a run that asked for N hosts gets them (the model's
    network figures may be assumptions), ranked by the group's cost all the same."""
    check_nodes(tier, nodes)
    every = [g for e in rank(tier, catalog, job_size=job_size, **filters)
             if (g := group_estimate(tier, e, nodes, job_size)) is not None]
    out = [g for g in every if nodes == 1 or g.speedup > 1.0] or (every if keep_slower else [])
    out.sort(key=lambda g: (g.est_cost, g.est_hours, g.host.offer.key))
    return out


def rank_job(tier: Tier, catalog: Catalog, nodes: int, job_size: int | None = None, **filters) -> list:
    """rank() for one host, rank_groups() for a group: either list reads as Estimates (offer, est_hours, est_cost)."""
    if nodes <= 1:
        return rank(tier, catalog, job_size=job_size, **filters)
    return rank_groups(tier, catalog, nodes, job_size=job_size, keep_slower=True, **filters)
