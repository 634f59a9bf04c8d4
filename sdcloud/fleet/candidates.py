"""Which offers a fleet may launch: the optimizer's best, split into one candidate per zone."""

from __future__ import annotations

from typing import Callable

from ..errors import UserError
from ..events import Kind
from ..offers.catalog import CatalogRow, load_catalog
from ..offers.optimizer import Offer, rank
from ..offers.tiers import Tier
from ..providers.base import ProviderError
from ..providers.capabilities import HasZones
from ..providers.traits import traits
from ..spot.policy import ON_DEMAND, SPOT

# How many of the best offers of each market a fleet keeps as candidates.
SPOT_CANDIDATES = 6
ONDEMAND_CANDIDATES = 2


def zone_key(offer: Offer) -> str:
    """One zone's offer of one type, as cooldowns and the policy name it."""
    r = offer.row
    return f"{r.provider}/{r.region}/{r.zone or '*'}/{r.instance_type}"


def attempt_zone_key(provider: str, region: str | None, zone: str | None, instance_type: str | None) -> str:
    return f"{provider}/{region}/{zone or '*'}/{instance_type}"


def candidates(provider, tier: Tier, market: str, *, max_price: float | None, region: str | None, job_size: int,
               events: Callable[[str, dict], None], gpus_used: int | None = None, book=None,
               name: str | None = None, nodes: int = 1) -> list[Offer]:
    """The offers to choose from. A provider without a price catalog (this machine, the user's
    boxes) lists its own; the others rank their catalog.

    `tier` is resolved already (the run's plan carries it); `name`: the provider's name as the run
    chose it (default its own `name`: test doubles may carry none); `gpus_used`: how many of a host's
    GPUs the owner's work drives (None: all), so that a host is estimated by the speed it will really
    give; `book`: the recorded and observed rates (sdcloud speeds);
    `nodes`: a multi-node group's size: its hosts' offers ranked as groups (offers/groups.py), those no
    faster as a group than one host left out."""
    name = name or provider.name
    if not traits(name).catalog:
        return list(provider.offers(tier, market))
    if nodes > 1:
        from ..offers.groups import rank_groups

        ranked = [g.host for g in rank_groups(tier, load_catalog([name]), nodes, job_size=job_size, keep_slower=True,
                                              max_price=max_price, provider=name, region=region, book=book)]
    else:
        ranked = rank(tier, load_catalog([name]), market=None, max_price=max_price, provider=name,
                      region=region, job_size=job_size, gpus_used=gpus_used, book=book)
    spot = [e for e in ranked if e.offer.market == SPOT][:SPOT_CANDIDATES]
    ondemand = [e for e in ranked if e.offer.market == ON_DEMAND][:ONDEMAND_CANDIDATES]
    return per_zone(provider, [e.offer for e in (spot + ondemand)], events)


def per_zone(provider, offers: list[Offer], events: Callable[[str, dict], None]) -> list[Offer]:
    """Split region-wide offers into one per zone, so that a reclaim cools down one zone, not the region."""
    if not isinstance(provider, HasZones):
        return offers
    out: list[Offer] = []
    cache: dict[str, list[str]] = {}
    for offer in offers:
        r = offer.row
        if r.zone:
            out.append(offer)
            continue
        if r.region not in cache:
            try:
                cache[r.region] = list(provider.zones(r.region))
            except (ProviderError, UserError, OSError) as exc:
                events(Kind.ZONES_UNKNOWN, {"region": r.region, "error": str(exc)})
                cache[r.region] = []
        zones = cache[r.region] or [""]
        out += [Offer(CatalogRow(**{**r.as_dict(), "zone": z}), offer.market) for z in zones]
    return out


def with_more_vram(offers: list[Offer], than_mib: int) -> list[Offer]:
    """The offers whose GPUs have more usable VRAM than `than_mib` (an attempt that ran out of
    memory with every rung of the agent's memory ladder: the same GPU would fail the same way)."""
    return [o for o in offers if o.row.usable_vram_mib > than_mib]


def vram_of(offers: list[Offer], key: str) -> int | None:
    """Usable VRAM (MiB per GPU) of the candidate with this zone key, or None."""
    for o in offers:
        if zone_key(o) == key:
            return o.row.usable_vram_mib
    return None
