"""The GPU offer catalog: instance facts and prices per provider, region and zone.

The bundled snapshot lives in the provider's own folder (sdcloud/providers/<provider>/catalog.csv).
`sdcloud catalog refresh` writes $SDCLOUD_HOME/catalog/<provider>.json, which replaces the bundled
rows of that provider.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import asdict, dataclass, fields, replace
from datetime import date, datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

from .. import clock, config
from ..errors import UserError
from .gpus import gpu_table

# Offers sit below providers in the house and cannot ask their traits: each provider with a catalog
# tells this module where its bundled file lies and what refreshes it when its traits are read
# (providers/traits.py). A shipped provider's file is found in its folder even before that.
# A file as importlib.resources gives it (a Traversable: importlib.resources.abc is Python 3.11's, and
# the cloud function's package runs this module on 3.10 too).
Traversable = Any
_BUNDLED: dict[str, Traversable] = {}
_HINTS: dict[str, str] = {}
BUNDLED_FILE = "catalog.csv"


def tell_bundled(provider: str, path: Traversable, refresh_hint: str) -> None:
    """Where `provider`'s bundled catalog lies, and the command that refreshes it (said in warnings)."""
    _BUNDLED[provider] = path
    _HINTS[provider] = refresh_hint


def forget_bundled(provider: str) -> None:
    _BUNDLED.pop(provider, None)
    _HINTS.pop(provider, None)


def _shipped() -> dict[str, Traversable]:
    """The shipped providers' catalogs: the `catalog.csv` in each folder of sdcloud/providers/."""
    folder = resources.files("sdcloud").joinpath("providers")
    return {p.name: p.joinpath(BUNDLED_FILE) for p in folder.iterdir() if p.is_dir() and p.joinpath(BUNDLED_FILE).is_file()}


def providers() -> tuple[str, ...]:
    """The providers with a bundled price catalog, by name: the shipped ones, then those told since."""
    return tuple(sorted(_shipped())) + tuple(sorted(set(_BUNDLED) - set(_shipped())))


def bundled_path(provider: str) -> Traversable:
    found = _BUNDLED.get(provider) or _shipped().get(provider)
    if found is None:
        raise KeyError(f"no bundled catalog for provider {provider!r}")
    return found


# How a price was obtained (docs/offers.md, "Where every number comes from"):
#   listed   a published list price, read as published (AWS Price List, Tencent's price overview)
#   quoted   a spot price quoted by the provider's API for one zone (describe_spot_price_history)
#   derived  computed from published figures by the formula the row's source states
#   estimate no published figure: an assumption, with its basis in the row's source
#   none     no figure at all (the market column is empty)
PRICE_BASES = ("listed", "quoted", "derived", "estimate", "none")

# Reclaim rate per hour for each AWS Spot Instance Advisor band (0: <5% ... 4: >20% a month).
# The advisor's monthly figures are fleet-wide; a GPU host kept alive is reclaimed far more often.
# Calibrated on shared/data/spot-traces/preemption/aws-2023-04-22-v100 (p3.2xlarge, band 4 in
# us-east-1 and us-west-2): 0.31-0.74 reclaims per alive hour, median about 0.5; lower bands are
# scaled by the band's midpoint (2.5/7.5/12.5/17.5/25 %).
BAND_RECLAIMS_PER_HOUR = (0.05, 0.15, 0.25, 0.35, 0.5)
BAND_LABELS = ("<5%", "5-10%", "10-15%", "15-20%", ">20%")
# Tencent Cloud publishes no interruption data: assume the middle band (documented in docs/offers.md).
DEFAULT_BAND = 2


@dataclass(frozen=True)
class CatalogRow:
    provider: str
    region: str
    zone: str  # "" when the price holds for every zone of the region
    instance_type: str
    gpu: str
    gpu_count: int
    vram_gb: float  # per GPU
    vcpus: int
    memory_gb: float
    nvme_gb: float  # local NVMe / instance store, all disks together
    ondemand_price: float | None  # per hour, in `currency`
    spot_price: float | None
    currency: str
    interruption_band: int | None
    snapshot_date: str
    ondemand_estimate: bool
    spot_estimate: bool
    source: str
    # Added for "prices you can trust": each market's own source, basis and date, and the GPU
    # memory the driver exposes. Defaults keep older refreshed files and callers working.
    vram_mib: int = 0  # usable MiB per GPU as the driver reports it; 0 = take it from gpus.csv
    ondemand_basis: str = ""  # one of PRICE_BASES, "" = unknown (an older catalog)
    spot_basis: str = ""
    ondemand_date: str = ""  # YYYY-MM-DD the figure was published or fetched; "" = not published
    spot_date: str = ""
    ondemand_source: str = ""
    spot_source: str = ""
    # A marketplace machine (Vast.ai, MarketRules.bandwidth_priced): what its own offer says beyond the
    # clouds' columns. `spot_price` is then the bid sdcloud places, `min_bid` the lowest the machine takes.
    min_bid: float | None = None
    upload_usd_per_gb: float = 0.0  # the run's bytes out of the machine (checkpoints to the store)
    download_usd_per_gb: float = 0.0  # ...and into it (model, dataset, a restored checkpoint)
    storage_usd_per_gb_month: float = 0.0  # its disk, billed running or paused
    dlperf: float = 0.0  # the marketplace's own deep-learning score of the machine (a prior for unknown GPUs)
    reliability: float = 0.0  # the host's measured reliability, 0-1

    @property
    def bandwidth_priced(self) -> bool:
        return bool(self.upload_usd_per_gb or self.download_usd_per_gb or self.storage_usd_per_gb_month)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def usable_vram_mib(self) -> int:
        """Usable memory per GPU in MiB: the row's own figure, else the GPU table's, else nominal."""
        if self.vram_mib:
            return self.vram_mib
        perf = gpu_table().get(self.gpu)
        if perf is not None and perf.usable_mib:
            return perf.usable_mib
        return int(self.vram_gb * 1024)

    def market_basis(self, market: str) -> str:
        basis = self.spot_basis if market == "spot" else self.ondemand_basis
        if basis:
            return basis
        return "estimate" if (self.spot_estimate if market == "spot" else self.ondemand_estimate) else "listed"

    def market_date(self, market: str) -> str:
        return (self.spot_date if market == "spot" else self.ondemand_date) or self.snapshot_date

    def market_source(self, market: str) -> str:
        return (self.spot_source if market == "spot" else self.ondemand_source) or self.source

    def price_age_days(self, market: str, now: datetime | None = None) -> float | None:
        """Days since the price of `market` was published or fetched; None when no date is known."""
        text = self.market_date(market)
        if not text:
            return None
        now = now or clock.utc_now()
        return round((now - _parse_time(text)).total_seconds() / 86400, 1)


def _opt_float(text: str | None) -> float | None:
    return None if text in (None, "") else float(text)


def row_from_mapping(raw: dict) -> CatalogRow:
    """A CatalogRow from a CSV row or a JSON object (numbers may arrive as strings)."""
    band = raw.get("interruption_band")
    return CatalogRow(
        provider=str(raw["provider"]),
        region=str(raw["region"]),
        zone=str(raw.get("zone") or ""),
        instance_type=str(raw["instance_type"]),
        gpu=str(raw["gpu"]),
        gpu_count=int(raw["gpu_count"]),
        vram_gb=float(raw["vram_gb"]),
        vcpus=int(raw["vcpus"]),
        memory_gb=float(raw["memory_gb"]),
        nvme_gb=float(raw.get("nvme_gb") or 0),
        ondemand_price=_opt_float(raw.get("ondemand_price")),
        spot_price=_opt_float(raw.get("spot_price")),
        currency=str(raw.get("currency") or "USD"),
        interruption_band=None if band in (None, "") else int(band),
        snapshot_date=str(raw.get("snapshot_date") or ""),
        ondemand_estimate=str(raw.get("ondemand_estimate")).lower() == "true",
        spot_estimate=str(raw.get("spot_estimate")).lower() == "true",
        source=str(raw.get("source") or ""),
        vram_mib=int(float(raw.get("vram_mib") or 0)),
        ondemand_basis=str(raw.get("ondemand_basis") or ""),
        spot_basis=str(raw.get("spot_basis") or ""),
        ondemand_date=str(raw.get("ondemand_date") or ""),
        spot_date=str(raw.get("spot_date") or ""),
        ondemand_source=str(raw.get("ondemand_source") or ""),
        spot_source=str(raw.get("spot_source") or ""),
        min_bid=_opt_float(raw.get("min_bid")),
        upload_usd_per_gb=float(raw.get("upload_usd_per_gb") or 0),
        download_usd_per_gb=float(raw.get("download_usd_per_gb") or 0),
        storage_usd_per_gb_month=float(raw.get("storage_usd_per_gb_month") or 0),
        dlperf=float(raw.get("dlperf") or 0),
        reliability=float(raw.get("reliability") or 0),
    )


@dataclass(frozen=True)
class CatalogSource:
    provider: str
    origin: str  # "bundled" or "refreshed"
    as_of: datetime | None  # None: no row of the catalog carries a published date
    path: str
    oldest: datetime | None = None  # the oldest dated price in it (a refresh may keep older spot prices)

    def age_days(self, now: datetime | None = None) -> float | None:
        if self.as_of is None:
            return None
        now = now or clock.utc_now()
        return (now - self.as_of).total_seconds() / 86400

    def describe(self, now: datetime | None = None) -> str:
        days = self.age_days(now)
        if days is None or self.as_of is None:
            return f"{self.provider}: {self.origin} catalog, prices of no published date"
        age = f"{days * 24:.0f} h" if days < 2 else f"{days:.0f} days"
        line = f"{self.provider}: {self.origin} catalog of {self.as_of.date().isoformat()} ({age} old)"
        if self.oldest is not None and self.oldest.date() < self.as_of.date():
            line += f", its oldest price from {self.oldest.date().isoformat()}"
        return line


@dataclass
class Catalog:
    rows: list[CatalogRow]
    sources: list[CatalogSource]


# How old a catalog may be before `offers` and `up` say so: [catalog] max_age_days in config.toml or
# SDCLOUD_CATALOG_MAX_AGE_DAYS. Spot prices move within days; a week keeps the warning meaningful.
DEFAULT_MAX_AGE_DAYS = 7.0
# Default spot discount assumed for a provider that publishes no spot prices (Tencent Cloud): the
# median discount of AWS GPU spot quotes against on-demand in shared/data/prices (155 region/type
# pairs, 60.4%), rounded down. [<provider>] spot_discount in config.toml or
# SDCLOUD_<PROVIDER>_SPOT_DISCOUNT ([tencent] spot_discount, SDCLOUD_TENCENT_SPOT_DISCOUNT).
DEFAULT_SPOT_DISCOUNT = 0.60


def _setting(env: str, section: str, key: str, default: float, low: float, high: float | None = None) -> float:
    raw: object = os.environ.get(env)
    what = env
    if raw is None:
        raw = config.settings().get(section, {}).get(key)
        what = f"config.toml [{section}] {key}"
    if raw is None:
        return default
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise UserError(f"{what} must be a number, got {raw!r}") from None
    if value < low or (high is not None and value >= high):
        bound = f"from {low:g} up to (not including) {high:g}" if high is not None else f"{low:g} or more"
        raise UserError(f"{what} must be {bound}, got {raw!r}")
    return value


def max_age_days() -> float:
    return _setting("SDCLOUD_CATALOG_MAX_AGE_DAYS", "catalog", "max_age_days", DEFAULT_MAX_AGE_DAYS, 0.0)


def spot_discount(provider: str) -> float:
    """The spot discount assumed for a provider that publishes no spot prices (docs/offers.md)."""
    return _setting(f"SDCLOUD_{provider.upper()}_SPOT_DISCOUNT", provider, "spot_discount", DEFAULT_SPOT_DISCOUNT,
                    0.0, 1.0)


def stale_warning(sources: list[CatalogSource], now: datetime | None = None) -> str | None:
    """One line naming every catalog older than max_age_days (or undated), with the refresh command; None if all fresh."""
    limit = max_age_days()
    old = []
    now = now or clock.utc_now()
    for s in sources:
        stamp = s.oldest or s.as_of
        if stamp is None:
            old.append((s, "has prices of no published date"))
            continue
        days = (now - stamp).total_seconds() / 86400
        if days > limit:
            old.append((s, f"has prices from {stamp.date().isoformat()} ({days:.0f} days old)"))
    if not old:
        return None
    parts = "; ".join(f"{s.provider} {s.origin} catalog {why}, refresh: "
                      f"{_HINTS.get(s.provider, f'`sdcloud catalog refresh --provider {s.provider}`')}"
                      for s, why in old)
    return f"warning: prices older than {limit:g} days: {parts}"


def refreshed_path(provider: str) -> Path:
    return config.home() / "catalog" / f"{provider}.json"


def _apply_spot_assumption(rows: list[CatalogRow]) -> list[CatalogRow]:
    """Estimated spot prices (a provider that publishes none: Tencent Cloud's rows) are on-demand x
    (1 - the provider's assumed discount); recompute them with the user's figure."""
    discounts: dict[str, float] = {}
    out = []
    for r in rows:
        # A marketplace row's interruptible price is a bid on its minimum (min_bid), not a discount.
        if r.spot_basis == "estimate" and r.ondemand_price is not None and r.min_bid is None:
            if r.provider not in discounts:
                discounts[r.provider] = spot_discount(r.provider)
            discount = discounts[r.provider]
            src = (f"estimate: on-demand x (1 - {discount:g}), the assumed {r.provider.capitalize()} spot discount "
                   f"([{r.provider}] spot_discount)")
            r = replace(r, spot_price=round(r.ondemand_price * (1 - discount), 4), spot_source=src)
        out.append(r)
    return out


def bundled_rows(provider: str) -> list[CatalogRow]:
    """The provider's bundled rows, under its own name (a copy of a provider's folder ranks as itself)."""
    text = bundled_path(provider).read_text()
    rows = [replace(row_from_mapping(r), provider=provider) for r in csv.DictReader(io.StringIO(text))]
    return _apply_spot_assumption(rows)


def _parse_time(text: str) -> datetime:
    stamp = datetime.fromisoformat(text) if "T" in text else datetime.combine(date.fromisoformat(text), datetime.min.time())
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)


def _oldest_price(rows: list[CatalogRow]) -> datetime | None:
    dates = [r.market_date(m) for r in rows for m, p in (("spot", r.spot_price), ("on-demand", r.ondemand_price))
             if p is not None and r.market_date(m)]
    return _parse_time(min(dates)) if dates else None


def load_provider(provider: str) -> tuple[list[CatalogRow], CatalogSource]:
    path = refreshed_path(provider)
    if path.exists():
        doc = json.loads(path.read_text())
        rows = _apply_spot_assumption([row_from_mapping(r) for r in doc["rows"]])
        return rows, CatalogSource(provider, "refreshed", _parse_time(doc["fetched_at"]), str(path), _oldest_price(rows))
    rows = bundled_rows(provider)
    dated = [r.snapshot_date for r in rows if r.snapshot_date]
    as_of = _parse_time(max(dated)) if dated else None
    return rows, CatalogSource(provider, "bundled", as_of, _shown(bundled_path(provider)), _oldest_price(rows))


def _shown(path: Traversable) -> str:
    """The bundled file as `catalog show` names it: relative to the sdcloud package where it lies in it."""
    text = str(path)
    root = str(resources.files("sdcloud"))
    return "sdcloud" + text[len(root):] if text.startswith(root) else text


def load_catalog(which: tuple[str, ...] | list[str] | None = None) -> Catalog:
    """The rows of `which` providers' catalogs (all with a catalog without it) and where each came from."""
    rows: list[CatalogRow] = []
    sources: list[CatalogSource] = []
    for provider in providers() if which is None else which:
        prov_rows, source = load_provider(provider)
        rows.extend(prov_rows)
        sources.append(source)
    return Catalog(rows, sources)


def write_refreshed(provider: str, rows: list[CatalogRow], errors: list[str] | None = None,
                    fetched_at: datetime | None = None) -> Path:
    """Write a refreshed catalog atomically; it replaces the bundled rows of `provider`."""
    path = refreshed_path(provider)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "provider": provider,
        "fetched_at": (fetched_at or clock.utc_now()).isoformat(),
        "errors": list(errors or []),
        "rows": [r.as_dict() for r in rows],
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)
    return path


ROW_FIELDS = tuple(f.name for f in fields(CatalogRow))
# The marketplace columns: a catalog file carries them only where one of its rows has them.
MARKET_FIELDS = ("min_bid", "upload_usd_per_gb", "download_usd_per_gb", "storage_usd_per_gb_month", "dlperf", "reliability")
