"""How each provider bills a host's compute, as the provider declares it (traits(name).billing).

The rules themselves are data in each `providers/<name>/__init__.py`; this module applies them:
- a minimum billed time per instance start (EC2: 60 s for Linux);
- a spot instance the cloud interrupts within its first seconds is not charged for compute (EC2:
  its first hour; an instance the user stops or terminates is charged);
- free hosts (this machine, the user's boxes): the machine's own price per hour when the user gave
  one (per second), else nothing;
- spot is priced at the attempt's own zone's price over the attempt's own seconds: the cloud's
  price history where it publishes one (`spot_prices = "history"`, AWS), else the samples sdcloud
  took at launch and while the host ran (`"samples"`, Tencent, whose spot is billed per second,
  settled hourly, with no minimum, and charged up to the reclaim).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..providers import loader
from ..providers.traits import names, traits
from .pricing import time_weighted_price, utc

HOURS_PER_MONTH = 730.0


@dataclass
class Charge:
    amount: float
    currency: str
    source: str  # price-history, samples, quote, list, rule, free
    detail: dict = field(default_factory=dict)


def storage_prices(provider: str) -> dict:
    """The provider's list prices for disks, bucket, requests and egress (its folder's file, named by
    TRAITS.billing.storage_prices); {} for a provider that charges none of them, or none sdcloud knows."""
    return loader.storage_prices(provider) if provider in names() else {}


def storage_price(provider: str, key: str) -> float:
    return float(storage_prices(provider).get(key, 0.0))


def native_currency(provider: str) -> str:
    return str(storage_prices(provider).get("currency", "USD"))


def mean_price(points: list[tuple[float, float]], start: float, end: float) -> float | None:
    """Time-weighted mean of a price that changes at `points` ((unix time, price), any order)."""
    if not points:
        return None
    if end <= start:
        return sorted(points)[-1][1]
    return time_weighted_price([(utc(t), p) for t, p in points], utc(start), utc(end))


def compute_charge(provider: str, market: str, start: float, end: float, end_reason: str | None,
                   quote: float | None, currency: str, points: list[tuple[float, float]] | None = None) -> Charge:
    """The compute charge of one attempt that ran from `start` to `end` (unix seconds).

    `quote` is the price per hour at launch (the list price for on-demand); `points` the spot
    price history or samples (the provider's `spot_prices`) of the attempt's own zone, in `currency`.
    """
    seconds = max(0.0, end - start)
    t = traits(provider)
    rules = t.billing
    if rules.free and not quote:
        return Charge(0.0, currency, "free", {"seconds": seconds})
    billed = seconds
    rule = None
    if rules.minimum_seconds:
        billed = max(rules.minimum_seconds, seconds) if seconds > 0 else 0.0
    if market == "spot" and end_reason == "preempted" and seconds < rules.free_spot_interrupt_seconds:
        return Charge(0.0, currency, "rule", {"seconds": seconds, "billed_seconds": 0.0,
                                              "rule": f"spot interrupted by the cloud in its first "
                                                      f"{_span(rules.free_spot_interrupt_seconds)}: no compute charge"})
    if billed > seconds:
        rule = f"{rules.minimum_seconds:g} s minimum"
    price, source = quote, ("list" if market != "spot" else "quote")
    if market == "spot" and points:
        mean = mean_price(points, start, end)
        if mean is not None:
            price, source = mean, ("price-history" if t.spot_prices == "history" else "samples")
    price = price or 0.0
    detail = {"seconds": round(seconds, 3), "billed_seconds": round(billed, 3), "price_per_hour": price}
    if rule:
        detail["rule"] = rule
    return Charge(price * billed / 3600.0, currency, source, detail)


def _span(seconds: float) -> str:
    return "hour" if seconds == 3600 else f"{seconds:g} s"


def disk_charge(provider: str, disk_gb: float, seconds: float) -> Charge:
    """Root and data disks for the host's lifetime (a disk is charged even when compute is not)."""
    rate = storage_price(provider, "disk_gb_month")
    hours = max(0.0, seconds) / 3600.0
    return Charge(disk_gb * hours * rate / HOURS_PER_MONTH, native_currency(provider), "list",
                  {"gb": disk_gb, "hours": round(hours, 6), "gb_month": rate})


def bucket_charge(provider: str, bytes_before: int, bytes_after: int, seconds: float) -> Charge:
    """GB-hours of the run's objects while the attempt ran (mean of the sizes at its start and end)."""
    rate = storage_price(provider, "bucket_gb_month")
    gb = (bytes_before + bytes_after) / 2 / 2**30
    hours = max(0.0, seconds) / 3600.0
    return Charge(gb * hours * rate / HOURS_PER_MONTH, native_currency(provider), "estimate",
                  {"gb_hours": round(gb * hours, 6), "gb_month": rate})


def request_charge(provider: str, puts: float, gets: float) -> Charge:
    put, get = storage_price(provider, "put_per_1000"), storage_price(provider, "get_per_1000")
    return Charge(puts / 1000 * put + gets / 1000 * get, native_currency(provider), "estimate",
                  {"puts": round(puts), "gets": round(gets), "put_per_1000": put, "get_per_1000": get})


def egress_charge(provider: str, nbytes: int, region: str | None = None) -> Charge:
    """Internet egress out of the provider's store: its list price in `region` and the account's
    currency (providers.loader.egress_price: a Tencent international-site account pays USD)."""
    if provider not in names():
        return Charge(0.0, "USD", "list", {"gb": round(nbytes / 2**30, 6), "per_gb": 0.0})
    price = loader.egress_price(provider, region)
    detail = {"gb": round(nbytes / 2**30, 6), "per_gb": price.per_gb, **({"region": region} if region else {})}
    return Charge(nbytes / 2**30 * price.per_gb, price.currency, "list", detail)
