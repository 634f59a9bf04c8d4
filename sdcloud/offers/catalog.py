"""The GPU offer catalog: instance facts and prices per provider, region and zone.

The bundled snapshot lives in sdcloud/data/catalog/<provider>.csv. `sdcloud catalog refresh`
writes $SDCLOUD_HOME/catalog/<provider>.json, which replaces the bundled rows of that provider.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import asdict, dataclass, fields
from datetime import date, datetime, timezone
from importlib import resources
from pathlib import Path

from .. import config

PROVIDERS = ("aws", "tencent")

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

    def as_dict(self) -> dict:
        return asdict(self)


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
    )


@dataclass(frozen=True)
class CatalogSource:
    provider: str
    origin: str  # "bundled" or "refreshed"
    as_of: datetime
    path: str

    def age_days(self, now: datetime | None = None) -> float:
        now = now or datetime.now(timezone.utc)
        return (now - self.as_of).total_seconds() / 86400

    def describe(self, now: datetime | None = None) -> str:
        days = self.age_days(now)
        age = f"{days * 24:.0f} h" if days < 2 else f"{days:.0f} days"
        return f"{self.provider}: {self.origin} catalog of {self.as_of.date().isoformat()} ({age} old)"


@dataclass
class Catalog:
    rows: list[CatalogRow]
    sources: list[CatalogSource]


def refreshed_path(provider: str) -> Path:
    return config.home() / "catalog" / f"{provider}.json"


def bundled_rows(provider: str) -> list[CatalogRow]:
    text = resources.files("sdcloud").joinpath(f"data/catalog/{provider}.csv").read_text()
    return [row_from_mapping(r) for r in csv.DictReader(io.StringIO(text))]


def _parse_time(text: str) -> datetime:
    stamp = datetime.fromisoformat(text) if "T" in text else datetime.combine(date.fromisoformat(text), datetime.min.time())
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)


def load_provider(provider: str) -> tuple[list[CatalogRow], CatalogSource]:
    path = refreshed_path(provider)
    if path.exists():
        doc = json.loads(path.read_text())
        rows = [row_from_mapping(r) for r in doc["rows"]]
        return rows, CatalogSource(provider, "refreshed", _parse_time(doc["fetched_at"]), str(path))
    rows = bundled_rows(provider)
    newest = max((r.snapshot_date for r in rows if r.snapshot_date), default="1970-01-01")
    return rows, CatalogSource(provider, "bundled", _parse_time(newest), f"sdcloud/data/catalog/{provider}.csv")


def load_catalog(providers: tuple[str, ...] | list[str] = PROVIDERS) -> Catalog:
    rows: list[CatalogRow] = []
    sources: list[CatalogSource] = []
    for provider in providers:
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
        "fetched_at": (fetched_at or datetime.now(timezone.utc)).isoformat(),
        "errors": list(errors or []),
        "rows": [r.as_dict() for r in rows],
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)
    return path


ROW_FIELDS = tuple(f.name for f in fields(CatalogRow))
