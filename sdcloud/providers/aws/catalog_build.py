"""The bundled AWS catalog (catalog.csv here) rebuilt from public figures (`python -m sdcloud.providers.build_catalogs`).

Inputs (docs/offers.md, "Where every number comes from"):
  shared/data/prices/aws_gpu_regions_skypilot_catalog.csv   on-demand + per-zone spot quotes, 5 regions
  shared/data/prices/aws_us-east-1_ondemand_<date>.csv       AWS Price List, us-east-1, dated
  shared/data/spot-advisor/gpu_linux_interruption_savings.csv interruption band per region/type
  instance_facts.csv (here)                                  local NVMe and the types missing above
"""

from __future__ import annotations

import csv
import io
import re
import statistics
from importlib import resources
from pathlib import Path

from ...offers.build_catalog import fmt, read_csv, usable_mib
from ...offers.catalog import CatalogRow
from ...offers.gpus import gpu_table
from .session import NAME

SKYPILOT = "prices/aws_gpu_regions_skypilot_catalog.csv"
ADVISOR = "spot-advisor/gpu_linux_interruption_savings.csv"
# The SkyPilot snapshot carries no date. It has AWS's June 2025 P4d/P5 prices, so it is no older than
# that: rows are dated 2025-06-01, the earliest it can be, so that their age is never understated.
SKYPILOT_DATE = "2025-06-01"
SKYPILOT_SOURCE = ("SkyPilot catalog snapshot (skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv, built from the AWS "
                   "Price List and describe_spot_price_history; shared/data/prices); snapshot date not recorded, dated "
                   f"{SKYPILOT_DATE}, the earliest it can be (it carries AWS's June 2025 P4d/P5 prices)")
ADVISOR_SOURCE = "AWS Spot Instance Advisor snapshot 2025-06 (shared/data/spot-advisor)"
FACTS = "instance_facts.csv"


def _own(name: str) -> str:
    """A data file of this provider's folder."""
    return resources.files(__package__).joinpath(name).read_text()


def _ondemand_list(shared: Path) -> tuple[dict[str, float], str, str]:
    """The dated us-east-1 list prices: ({type: usd}, date, file name)."""
    files = sorted((shared / "prices").glob("aws_us-east-1_ondemand_*.csv"))
    if not files:
        return {}, "", ""
    path = files[-1]
    stamp = re.search(r"(\d{4}-\d{2}-\d{2})", path.name)
    prices = {r["instance_type"]: float(r["ondemand_usd_per_hour"]) for r in read_csv(path)}
    return prices, stamp.group(1) if stamp else "", path.name


def build(shared: Path) -> list[CatalogRow]:
    """The bundled catalog's rows from the shared reference data (its sources: the module docstring)."""
    sky = read_csv(shared / SKYPILOT)
    listed, listed_date, listed_file = _ondemand_list(shared)
    listed_source = f"AWS Price List, us-east-1, generated {listed_date}"
    listed_cite = (f"{listed_source} into aws/karpenter-provider-aws pkg/providers/pricing/zz_generated.pricing_aws.go "
                   f"(shared/data/prices/{listed_file})")
    bands = {(r["region"], r["instance_type"]): int(r["interruption_range_index"]) for r in read_csv(shared / ADVISOR)}
    facts = {r["instance_type"]: r for r in csv.DictReader(io.StringIO(_own(FACTS)))}
    rows: list[CatalogRow] = []
    seen: set[tuple[str, str]] = set()

    def make(itype: str, region: str, gpu: str, count: int, vcpus: int, memory: float, reported_mib: int | None,
             od: float | None, od_src: str, od_cite: str, od_date: str, quotes: list[float]) -> CatalogRow:
        fact = facts.get(itype)
        if fact is None:
            raise SystemExit(f"{itype}: no row in sdcloud/providers/aws/instance_facts.csv (local NVMe unknown)")
        if quotes:
            spot = round(statistics.median(quotes), 4)
            spot_basis = "derived"
            spot_src = f"median of {len(quotes)} zone quotes ({fmt(min(quotes))}-{fmt(max(quotes))}), SkyPilot snapshot"
            spot_date = SKYPILOT_DATE
        else:
            spot, spot_basis, spot_date = None, "none", ""
            spot_src = "no spot quote for this region and type in the sources"
        band = bands.get((region, itype))
        band_src = (f"band: {ADVISOR_SOURCE}" if band is not None
                    else "band: not in the advisor snapshot (the middle band is assumed)")
        dates = [d for d in (od_date, spot_date) if d]
        return CatalogRow(
            provider=NAME, region=region, zone="", instance_type=itype, gpu=gpu, gpu_count=count,
            vram_gb=gpu_table()[gpu].vram_gb, vcpus=vcpus, memory_gb=memory, nvme_gb=float(fact["nvme_gb"]),
            ondemand_price=od, spot_price=spot, currency="USD", interruption_band=band,
            snapshot_date=min(dates) if dates else "", ondemand_estimate=False, spot_estimate=False,
            source=(f"on-demand: {od_cite}; spot: {spot_src}"
                    + (f" (zone names not kept) in the {SKYPILOT_SOURCE}" if quotes else "")
                    + f"; {band_src}; NVMe: {fact['source']}"),
            vram_mib=usable_mib(gpu, reported_mib), ondemand_basis="listed" if od is not None else "none",
            spot_basis=spot_basis, ondemand_date=od_date, spot_date=spot_date, ondemand_source=od_src, spot_source=spot_src)

    for r in sky:
        itype, region = r["instance_type"], r["region"]
        gpu = facts[itype]["gpu"] if itype in facts else r["gpu"]
        quotes = [float(q) for q in r["spot_usd_per_hour_by_zone"].split(";") if q.strip()]
        if region == "us-east-1" and itype in listed:
            od, od_src, od_cite, od_date = listed[itype], listed_source, listed_cite, listed_date
        else:
            od, od_src, od_cite, od_date = (float(r["ondemand_usd_per_hour"]), "SkyPilot snapshot (undated, June 2025 or later)",
                                            SKYPILOT_SOURCE, SKYPILOT_DATE)
        rows.append(make(itype, region, gpu, int(r["gpu_count"]), int(float(r["vcpus"])), float(r["memory_gib"]),
                         int(r["gpu_memory_mib"]), od, od_src, od_cite, od_date, quotes))
        seen.add((region, itype))
    # Types the dated list has and the snapshot lacks (p4de, g6.24xlarge, g6e.16x/24x): us-east-1 only,
    # on-demand only; facts from instance_facts.csv.
    for itype, price in sorted(listed.items()):
        if ("us-east-1", itype) in seen:
            continue
        fact = facts.get(itype)
        if fact is None:
            raise SystemExit(f"{itype}: no row in sdcloud/providers/aws/instance_facts.csv")
        rows.append(make(itype, "us-east-1", fact["gpu"], int(fact["gpu_count"]), int(fact["vcpus"]),
                         float(fact["memory_gb"]), None, price, listed_source, listed_cite + f"; facts: {fact['source']}",
                         listed_date, []))
    rows.sort(key=lambda x: (x.instance_type.split(".")[0], x.gpu_count, x.vcpus, x.instance_type, x.region))
    return rows
