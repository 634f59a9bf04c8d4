"""Rank GPU offers by the expected cost to finish a job, not by the price per hour.

    hours    = setup + job size / rate
    rate     = what the user recorded or runs observed on that GPU (sdcloud speeds), else the catalog's:
               training: the training model (offers/rates.py), batch: reference rate x GPU speed;
               times the multi-GPU speed-up
    overhead = 1 + reclaims per hour x (restart hours + checkpoint interval / 2)   (spot only)
    est_cost = price per hour (USD) x hours x overhead
    a move   = offers outside the run's home cloud (the first of several providers) start with the
               inputs and checkpoint copied there: + the copy's hours (paid at the host's price) and
               the home cloud's egress (offers/moves.py), as a restart with a larger overhead

Inputs and their sources are in docs/offers.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from .. import config
from .catalog import BAND_LABELS, BAND_RECLAIMS_PER_HOUR, DEFAULT_BAND, Catalog, CatalogRow, providers
from ..errors import UserError
from ..money import usd
from .bandwidth import Bandwidth, bandwidth
from .kinds import RunKind
from .moves import Egress, MoveCost, move_cost

from .rates import Rate, RateBook, host_rate
from .tiers import Tier

# A host's network figure for a move's copy: (Gbps, basis), or (None, "") where none is known.
HostNetwork = Callable[[CatalogRow], tuple[float | None, str]]

MARKETS = ("spot", "on-demand")
# Boot, image pull, model download and dataset staging before the first step (assumption).
SETUP_HOURS = 0.15
# What one reclaim costs: a new host to the first step again, plus on average half a
# checkpoint interval of lost work (the agent saves every 15 minutes by default).
RESTART_HOURS = 0.2
CHECKPOINT_INTERVAL_HOURS = 0.25
# The band's reclaim rate counts as this many spot hours of evidence beside what runs observed in a
# zone: one short attempt reclaimed (or never reclaimed) moves the rate, and does not replace it.
PRIOR_SPOT_HOURS = 4.0


@dataclass(frozen=True)
class Offer:
    """One way to run a job: an instance type in a region/zone, in one market."""

    row: CatalogRow
    market: str  # "spot" or "on-demand"

    @property
    def price_per_hour(self) -> float:
        price = self.row.spot_price if self.market == "spot" else self.row.ondemand_price
        assert price is not None
        return price

    @property
    def price_per_hour_usd(self) -> float:
        return self.price_per_hour * config.usd_per(self.row.currency)

    @property
    def ondemand_price_per_hour_usd(self) -> float | None:
        if self.row.ondemand_price is None:
            return None
        return self.row.ondemand_price * config.usd_per(self.row.currency)

    @property
    def band(self) -> int | None:
        if self.market != "spot":
            return None
        return self.row.interruption_band if self.row.interruption_band is not None else DEFAULT_BAND

    @property
    def key(self) -> str:
        r = self.row
        return f"{r.provider}/{r.region}/{r.zone or '*'}/{r.instance_type}/{self.market}"


@dataclass(frozen=True)
class Estimate:
    offer: Offer
    est_hours: float
    est_cost: float  # USD
    overhead: float
    warnings: tuple[str, ...] = field(default=())
    kind: str = ""  # the tier's kind, "train" or "batch": which speed figure was used
    rate: Rate | None = None  # steps/s or images/s on this host, before overheads, and its source
    ref_rate: float = 0.0  # the tier's rate on one A10G: speed_rel is rate / ref_rate
    move: MoveCost | None = None  # the move from the home cloud an offer in another cloud starts with
    bandwidth: Bandwidth | None = None  # a marketplace machine's priced bytes and disk, in est_cost (offers/bandwidth.py)
    reclaims_per_hour: float | None = None  # spot: the rate the overhead used (None on-demand)
    reclaim_source: str = ""  # where that rate comes from: the catalog's band, or what runs observed in the zone
    restart_hours: float = RESTART_HOURS  # what one reclaim costs before the host trains again
    restart_source: str = "assumed"

    def as_dict(self) -> dict:
        o, r = self.offer, self.offer.row
        band = o.band
        if band is None:
            interruption = "none"
        elif r.interruption_band is None:
            interruption = f"{BAND_LABELS[band]} (assumed)"
        else:
            interruption = BAND_LABELS[band]
        return {
            "provider": r.provider,
            "region": r.region,
            "zone": r.zone,
            "instance_type": r.instance_type,
            "gpu": r.gpu,
            "gpu_count": r.gpu_count,
            "vram_gb": r.vram_gb,
            "vram_mib": r.usable_vram_mib,
            "vcpus": r.vcpus,
            "memory_gb": r.memory_gb,
            "nvme_gb": r.nvme_gb,
            "market": o.market,
            "price_per_hour": o.price_per_hour,
            "ondemand_price_per_hour": r.ondemand_price,
            "currency": r.currency,
            "price_per_hour_usd": round(o.price_per_hour_usd, 4),
            "est_hours": round(self.est_hours, 3),
            "est_cost": round(self.est_cost, 4),
            "est_cost_currency": "USD",
            "overhead": round(self.overhead, 4),
            "interruption": interruption,
            "price_estimate": r.market_basis(o.market) == "estimate",
            "snapshot_date": r.snapshot_date,
            "price_basis": r.market_basis(o.market),
            "price_date": r.market_date(o.market) or None,
            "price_age_days": r.price_age_days(o.market),
            "price_source": r.market_source(o.market),
            "speed_rel": round(self.rate.value / self.ref_rate, 3) if self.rate and self.ref_rate else None,
            "speed_source": self.speed_source,
            "rate": round(self.rate.value, 4) if self.rate else None,
            "rate_unit": ("steps/s" if self.kind == RunKind.TRAIN else "images/s") if self.kind else None,
            "rate_source": self.rate.source if self.rate else None,
            "warnings": list(self.warnings),
            "reclaims_per_hour": None if self.reclaims_per_hour is None else round(self.reclaims_per_hour, 4),
            "reclaim_source": self.reclaim_source or None,
            "restart_hours": round(self.restart_hours, 4),
            "restart_source": self.restart_source,
            "move": None if self.move is None else {"egress_usd": round(self.move.egress_usd, 4),
                                                    "transfer_hours": round(self.move.transfer_hours, 4),
                                                    "bytes": self.move.bytes, "reason": self.move.reason},
            "bandwidth": None if self.bandwidth is None else self.bandwidth.as_dict(),
            "min_bid": r.min_bid,  # a marketplace machine's lowest interruptible bid; the spot price is sdcloud's bid
            "bid": o.price_per_hour if o.market == "spot" and r.min_bid is not None else None,
        }

    @property
    def speed_source(self) -> str:
        return self.rate.source if self.rate else "unknown GPU"


def spot_overhead(band: int | None, reclaims_per_hour: float | None = None, restart_hours: float = RESTART_HOURS) -> float:
    if band is None:
        return 1.0
    rate = BAND_RECLAIMS_PER_HOUR[band] if reclaims_per_hour is None else reclaims_per_hour
    return 1.0 + rate * (restart_hours + CHECKPOINT_INTERVAL_HOURS / 2)


def reclaim_rate(offer: Offer, book: Any = None) -> tuple[float | None, str]:
    """A spot offer's reclaims per hour and where the figure comes from: the catalog's band, with what
    runs observed in its zone where they did (the band counted as PRIOR_SPOT_HOURS of evidence)."""
    band = offer.band
    if band is None:
        return None, ""
    prior = BAND_RECLAIMS_PER_HOUR[band]
    row = offer.row
    seen = book.reclaims(row.provider, row.zone, row.region) if book is not None and hasattr(book, "reclaims") else None
    if not seen:
        return prior, f"band {BAND_LABELS[band]}"
    n, hours = seen
    rate = (n + prior * PRIOR_SPOT_HOURS) / (hours + PRIOR_SPOT_HOURS)
    return rate, (f"observed: {n} reclaim{'s' if n != 1 else ''} in {hours:.2f} spot h in {row.zone or row.region}, "
                  f"with the band's")


def restart_of(tier: Tier, provider: str, book: Any = None) -> tuple[float, str]:
    """Hours one reclaim costs before the host trains again: what runs measured on the provider (launch
    to the first trained step after a resume), else RESTART_HOURS."""
    seen = book.restart_seconds(tier, provider) if book is not None and hasattr(book, "restart_seconds") else None
    if not seen:
        return RESTART_HOURS, "assumed"
    seconds, n = seen
    return seconds / 3600.0, f"observed: median of {n} restart{'s' if n != 1 else ''}"


def offer_rate(tier: Tier, row: CatalogRow, gpus_used: int | None = None, book: RateBook | None = None) -> Rate | None:
    """The rate of one host of `row` for the tier (the book's figure where it has one); None if the GPU is unknown.

    `gpus_used`: how many of the host's GPUs the trainer drives (None: all of them). A trainer on
    one GPU of an 8-GPU host is no faster than on a 1-GPU host, however the host is priced."""
    used = row.gpu_count if gpus_used is None else max(1, min(gpus_used, row.gpu_count))
    return host_rate(tier, row.provider, row.instance_type, row.gpu, used, book)


def job_hours(tier: Tier, row: CatalogRow, job_size: int | None = None,
              gpus_used: int | None = None, book: RateBook | None = None) -> float | None:
    """Hours of compute for the job on one host of `row`, without reclaims; None if the GPU is unknown."""
    rate = offer_rate(tier, row, gpus_used, book)
    if rate is None:
        return None
    return SETUP_HOURS + (job_size or tier.job_size) / rate.value / 3600.0


def estimate(tier: Tier, offer: Offer, job_size: int | None = None,
             gpus_used: int | None = None, book: RateBook | None = None) -> Estimate | None:
    rate = offer_rate(tier, offer.row, gpus_used, book)
    if rate is None:
        return None
    hours = SETUP_HOURS + (job_size or tier.job_size) / rate.value / 3600.0
    reclaims, reclaim_source = reclaim_rate(offer, book)
    restart, restart_source = restart_of(tier, offer.row.provider, book)
    overhead = spot_overhead(offer.band, reclaims, restart)
    warnings = []
    r = offer.row
    usable_gb = r.usable_vram_mib / 1024
    if usable_gb < tier.rec_vram_gb:
        warnings.append(f"{usable_gb:.1f} GB usable VRAM is below the recommended {tier.rec_vram_gb:g} GB: "
                        "smaller batches, slower")
    if r.vcpus and r.vcpus < tier.vcpus:
        # RAM below the tier's is filtered out (fits); fewer vCPUs only slows data loading: warned.
        warnings.append(f"{r.vcpus} vCPUs is below the {tier.vcpus} the tier asks for: image decoding may slow the GPU")
    if tier.nvme_gb > 0 and r.nvme_gb <= 0:
        warnings.append("no local NVMe: data and checkpoints on network disk")
    elif 0 < r.nvme_gb < tier.nvme_gb:
        warnings.append(f"{r.nvme_gb:g} GB NVMe is below the {tier.nvme_gb:g} GB the tier wants")
    bw = bandwidth(tier, r, hours * overhead, CHECKPOINT_INTERVAL_HOURS)
    return Estimate(offer, hours * overhead, offer.price_per_hour_usd * hours * overhead + (bw.usd if bw else 0.0), overhead,
                    tuple(warnings), tier.kind, rate, tier.ref_rate, bandwidth=bw, reclaims_per_hour=reclaims,
                    reclaim_source=reclaim_source, restart_hours=restart, restart_source=restart_source)


def fits(tier: Tier, row: CatalogRow) -> bool:
    """The tier's floors against the host: VRAM compared as the driver reports it (usable MiB), not the card's size."""
    return (row.usable_vram_mib / 1024 >= tier.min_vram_gb and row.memory_gb >= tier.memory_gb
            and row.gpu_count >= tier.gpu_count)


def check_region(rows: list, region: str, provider: str | None = None) -> None:
    """Refuse a region that no catalog row (of `provider`'s, when given) is in, naming the known ones."""
    regions = sorted({r.region for r in rows if provider is None or r.provider == provider})
    if region not in regions:
        raise UserError(f"unknown region {region!r}" + (f" for {provider}" if provider else "")
                        + f"; known: {', '.join(regions)}")


def rank(
    tier: Tier,
    catalog: Catalog,
    market: str | None = None,
    max_price: float | None = None,
    provider: str | None = None,
    region: str | None = None,
    job_size: int | None = None,
    gpus_used: int | None = None,
    book: RateBook | None = None,
    clouds: Sequence[str] | None = None,
    move_bytes: int = 0,
    move_egress: Egress | None = None,
    move_network: HostNetwork | None = None,
) -> list[Estimate]:
    """Offers that meet the tier, cheapest expected cost to finish first.

    `max_price` is USD per hour; `gpus_used` how many GPUs of a host the trainer drives (None: all);
    `book`: recorded and observed rates that take the catalog's place (sdcloud.speeds.book.user_book()).
    `clouds`: several providers ranked in one table, the first the home: an offer in another one
    carries the move of `move_bytes` there (Estimate.move) in its hours and cost, at the home cloud's
    `move_egress` (providers.loader.egress_price), copied at `move_network(row)`: the offer's host
    network (Gbps, basis), since that host does the copy.
    Raises UserError for a filter that nothing matches.
    """
    if market is not None and market not in MARKETS:
        raise UserError(f"unknown market {market!r}; valid: {', '.join(MARKETS)}")
    if max_price is not None:  # what the flag's click type checked already; code that calls rank, here
        max_price = usd(max_price, "--max-price", per_hour=True)
    if job_size is not None and job_size <= 0:
        raise UserError(f"--steps must be a positive whole number, got {job_size}")
    rows = catalog.rows
    if provider is not None:
        known = sorted({r.provider for r in rows} | set(providers()))
        if provider not in known:
            raise UserError(f"unknown provider {provider!r}; valid: {', '.join(known)}")
        rows = [r for r in rows if r.provider == provider]
    if clouds:
        rows = [r for r in rows if r.provider in clouds]
    if region is not None:
        check_region(rows, region, provider)
        rows = [r for r in rows if r.region == region]
    markets = (market,) if market else MARKETS
    candidates: list[Estimate] = []
    for row in rows:
        if not fits(tier, row):
            continue
        for m in markets:
            if (row.spot_price if m == "spot" else row.ondemand_price) is None:
                continue
            est = estimate(tier, Offer(row, m), job_size, gpus_used, book)
            if est is not None:
                candidates.append(est)
    if max_price is not None:
        within = [e for e in candidates if e.offer.price_per_hour_usd <= max_price + 1e-9]
        if candidates and not within:
            lowest = min(e.offer.price_per_hour_usd for e in candidates)
            raise UserError(f"no {market or ''} offer for {tier.name} at or below ${max_price:g}/h; "
                            f"the lowest that qualifies is ${lowest:.4f}/h".replace("  ", " "))
        candidates = within
    if clouds and len(clouds) > 1:
        candidates = [with_move(e, clouds[0], move_bytes, move_egress, move_network) for e in candidates]
    candidates.sort(key=lambda e: (e.est_cost, e.est_hours, e.offer.key))
    return candidates


def with_move(est: Estimate, home: str, move_bytes: int, egress: Egress | None,
              host_network: HostNetwork | None = None) -> Estimate:
    """The estimate of an offer outside the home cloud, with the move there: the copy's hours before
    the first step (the host paid meanwhile, and it is the host that copies, at its network figure)
    and the home cloud's egress; an offer at home unchanged."""
    if est.offer.row.provider == home:
        return est
    gbps, basis = host_network(est.offer.row) if host_network is not None else (None, "")
    move = move_cost(home, est.offer.row.provider, move_bytes, egress=egress, host_gbps=gbps, host_basis=basis)
    hours = est.est_hours + move.transfer_hours
    cost = est.est_cost + est.offer.price_per_hour_usd * move.transfer_hours + move.egress_usd
    return replace(est, est_hours=hours, est_cost=cost, move=move)
