"""`sdcloud catalog refresh --provider aws`: instance facts and prices from the AWS APIs.

Per region, concurrently:
  facts      ec2 describe_instance_types (GpuInfo, InstanceStorageInfo/NvmeSupport, vCPUs, memory)
  spot       ec2 describe_spot_price_history from now: the price in effect, per availability zone
  on-demand  pricing get_products (Price List API, served from us-east-1), Linux, shared tenancy

Rows: one per (region, type) with the on-demand price (zone ""), and one per (zone, type) with
that zone's spot price, so that the optimizer ranks each zone's spot price on its own and the
launch of a spot offer goes to the zone that was priced. A region or service that fails is named
in the errors and leaves the previous rows in place: the bundled on-demand price for that
(region, type), the bundled spot estimate, or the whole region as it was.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from botocore.exceptions import BotoCoreError, ClientError

from ... import clock
from ...offers.catalog import CatalogRow, bundled_rows, load_provider, write_refreshed
from ...errors import UserError
from ...offers.gpus import gpu_table
from ..base import ProviderError
from .session import CLIENT_CONFIG, NAME, Retry, check_region, error_code, error_message, new_session

PRICING_REGION = "us-east-1"  # the Price List API answers in us-east-1 (also eu-central-1, ap-south-1)
# Families with NVIDIA GPUs that the Deep Learning AMI (x86_64) supports.
FAMILIES = ("g4dn", "g5", "g6", "g6e", "gr6", "p3", "p3dn", "p4d", "p4de", "p5")
SPOT_PRODUCTS = ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"]


@dataclass(frozen=True)
class Facts:
    instance_type: str
    gpu: str
    gpu_count: int
    vram_gb: float
    vcpus: int
    memory_gb: float
    nvme_gb: float


def gpu_model(name: str, memory_mib: float) -> str | None:
    """AWS GpuInfo name and memory -> a key of sdcloud/data/gpus.csv, or None when unknown."""
    n = name.upper().replace("NVIDIA", "").replace("TESLA", "").strip()
    gb = memory_mib / 1024
    if n == "V100":
        n = "V100-32GB" if gb >= 24 else "V100"
    elif n == "A100":
        n = "A100-80GB" if gb >= 60 else "A100"
    elif n.startswith("H100"):
        n = "H100"
    table = gpu_table()
    match = next((k for k in table if k.upper() == n), None)
    return match


def instance_facts(items: Iterable[dict]) -> dict[str, Facts]:
    """describe_instance_types entries -> facts, for x86_64 types with a GPU sdcloud can rank."""
    out: dict[str, Facts] = {}
    for it in items:
        gpus = (it.get("GpuInfo") or {}).get("Gpus") or []
        if not gpus or "x86_64" not in (it.get("ProcessorInfo") or {}).get("SupportedArchitectures", ["x86_64"]):
            continue
        g = gpus[0]
        if str(g.get("Manufacturer", "NVIDIA")).upper() != "NVIDIA":
            continue
        model = gpu_model(str(g.get("Name", "")), float((g.get("MemoryInfo") or {}).get("SizeInMiB", 0)))
        if model is None:
            continue
        storage = it.get("InstanceStorageInfo") or {}
        nvme = float(storage.get("TotalSizeInGB") or 0) if storage.get("NvmeSupport") in ("required", "supported") else 0.0
        out[it["InstanceType"]] = Facts(
            instance_type=it["InstanceType"], gpu=model, gpu_count=int(sum(x.get("Count", 1) for x in gpus)),
            # AWS reports the memory the driver can use (A10G: 22888 MiB); rank on the card's size.
            vram_gb=gpu_table()[model].vram_gb,
            vcpus=int((it.get("VCpuInfo") or {}).get("DefaultVCpus", 0)),
            memory_gb=round(float((it.get("MemoryInfo") or {}).get("SizeInMiB", 0)) / 1024, 2),
            nvme_gb=nvme,
        )
    return out


def parse_price_list(items: Iterable[Any], region: str | None = None) -> dict[str, float]:
    """Price List API products -> on-demand USD per hour per instance type (Linux, shared, no licence)."""
    prices: dict[str, float] = {}
    for item in items:
        doc = json.loads(item) if isinstance(item, (str, bytes)) else item
        attrs = doc.get("product", {}).get("attributes", {})
        itype = attrs.get("instanceType")
        if not itype or (region and attrs.get("regionCode", region) != region):
            continue
        if (attrs.get("operatingSystem", "Linux") != "Linux" or attrs.get("tenancy", "Shared") != "Shared"
                or attrs.get("preInstalledSw", "NA") != "NA" or attrs.get("capacitystatus", "Used") != "Used"):
            continue
        # Capacity Blocks for ML are reserved ahead at a supply-and-demand price: never an on-demand one.
        if (attrs.get("marketoption", "OnDemand") != "OnDemand"
                or "CapacityBlock" in str(attrs.get("usagetype", "")) + str(attrs.get("operation", ""))):
            continue
        for term in doc.get("terms", {}).get("OnDemand", {}).values():
            for dim in term.get("priceDimensions", {}).values():
                if dim.get("unit") != "Hrs":
                    continue
                usd = float(dim.get("pricePerUnit", {}).get("USD", 0) or 0)
                if usd > 0:
                    prices[itype] = min(usd, prices.get(itype, usd))
    return prices


def latest_spot(items: Iterable[dict]) -> dict[tuple[str, str], tuple[datetime, float]]:
    """describe_spot_price_history entries -> the newest (time, price) per (zone, type)."""
    newest: dict[tuple[str, str], tuple[datetime, float]] = {}
    for it in items:
        key = (it["AvailabilityZone"], it["InstanceType"])
        stamp = it["Timestamp"]
        if key not in newest or stamp > newest[key][0]:
            newest[key] = (stamp, float(it["SpotPrice"]))
    return newest


def _describe(exc: BaseException) -> str:
    if isinstance(exc, (UserError, ProviderError)):
        return str(exc)
    code = error_code(exc)
    return f"{code}: {error_message(exc, 160)}" if code else f"{type(exc).__name__}: {error_message(exc, 160)}"


def _pages(retry: Retry, client, op: str, key: str, **params: Any) -> list:
    def run() -> list:
        out: list = []
        for page in client.get_paginator(op).paginate(**params):
            out.extend(page.get(key, []))
        return out

    return retry.call(run, op)


FAILURES = (ClientError, BotoCoreError, ProviderError, UserError, ValueError, KeyError)


def refresh_region(region: str, ec2, pricing, retry: Retry, previous: list[CatalogRow], bundled: dict,
                   today: str) -> tuple[list[CatalogRow], list[str]]:
    """Rows for one region, and what failed. Never raises for an AWS failure."""
    errors: list[str] = []
    try:
        items = _pages(retry, ec2, "describe_instance_types", "InstanceTypes",
                       Filters=[{"Name": "instance-type", "Values": [f"{f}.*" for f in FAMILIES]}])
        facts = instance_facts(items)
    except FAILURES as exc:
        return previous, [f"{region}: ec2 describe_instance_types failed ({_describe(exc)}); previous rows kept"]
    if not facts:
        return previous, [f"{region}: no GPU instance types found; previous rows kept"]

    spot: dict[tuple[str, str], tuple[datetime, float]] | None
    try:
        spot = latest_spot(_pages(retry, ec2, "describe_spot_price_history", "SpotPriceHistory",
                                  InstanceTypes=sorted(facts), ProductDescriptions=SPOT_PRODUCTS,
                                  StartTime=datetime.now(timezone.utc)))
    except FAILURES as exc:
        spot = None
        errors.append(f"{region}: ec2 describe_spot_price_history failed ({_describe(exc)}); bundled spot estimates kept")

    ondemand: dict[str, float] | None
    if pricing is None:
        ondemand = None
    else:
        try:
            ondemand = parse_price_list(_pages(
                retry, pricing, "get_products", "PriceList", ServiceCode="AmazonEC2",
                Filters=[{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in (
                    ("regionCode", region), ("operatingSystem", "Linux"), ("tenancy", "Shared"),
                    ("preInstalledSw", "NA"), ("capacitystatus", "Used"), ("instanceFamily", "GPU instance"),
                    ("marketoption", "OnDemand"))]),
                region)
        except FAILURES as exc:
            ondemand = None
            errors.append(f"{region}: pricing get_products failed ({_describe(exc)}); bundled on-demand prices kept")

    rows: list[CatalogRow] = []
    for itype, f in sorted(facts.items()):
        old: CatalogRow | None = bundled.get((region, itype))
        band = old.interruption_band if old else None
        od_price = (ondemand or {}).get(itype)
        od_est = False
        od_src = "on-demand: AWS Price List API"
        # Each market keeps its own basis and date: a price carried from the bundled catalog keeps the bundled date.
        od_meta = dict(ondemand_basis="listed", ondemand_date=today, ondemand_source=f"AWS Price List API, fetched {today}")
        if od_price is None and old is not None and old.ondemand_price is not None:
            od_price, od_est, od_src = old.ondemand_price, old.ondemand_estimate, "on-demand: bundled list price"
            od_meta = dict(ondemand_basis=old.market_basis("on-demand"), ondemand_date=old.market_date("on-demand"),
                           ondemand_source=old.market_source("on-demand"))
        elif od_price is None:
            od_meta = dict(ondemand_basis="none", ondemand_date="", ondemand_source="no on-demand price in the Price List")
        zone_spots = {z: v for (z, t), v in (spot or {}).items() if t == itype}
        region_spot = None
        spot_src = ""
        if spot is None and old is not None and old.spot_price is not None:
            region_spot, spot_src = old.spot_price, "; spot: bundled estimate"
        common = dict(provider=NAME, region=region, instance_type=itype, gpu=f.gpu, gpu_count=f.gpu_count,
                      vram_gb=f.vram_gb, vcpus=f.vcpus, memory_gb=f.memory_gb, nvme_gb=f.nvme_gb, currency="USD",
                      interruption_band=band, snapshot_date=today)
        if od_price is not None or region_spot is not None:
            spot_meta = (dict(spot_basis=old.market_basis("spot"), spot_date=old.market_date("spot"),
                              spot_source=old.market_source("spot")) if region_spot is not None and old is not None
                         else dict(spot_basis="none", spot_date="", spot_source="no spot quote for the region as a whole"))
            rows.append(CatalogRow(zone="", ondemand_price=od_price, spot_price=region_spot,
                                   ondemand_estimate=od_est,
                                   spot_estimate=region_spot is not None and spot_meta["spot_basis"] == "estimate",
                                   source=f"refreshed {today}: facts: describe_instance_types; {od_src}{spot_src}",
                                   **od_meta, **spot_meta, **common))
        for zone, (stamp, price) in sorted(zone_spots.items()):
            rows.append(CatalogRow(zone=zone, ondemand_price=None, spot_price=price, ondemand_estimate=False,
                                   spot_estimate=False,
                                   source=f"refreshed {today}: facts: describe_instance_types; "
                                          f"spot: describe_spot_price_history {zone} as of {stamp.isoformat()}",
                                   ondemand_basis="none",
                                   ondemand_source="no on-demand price on a zone row (the region row has it)",
                                   spot_basis="quoted", spot_date=stamp.date().isoformat(),
                                   spot_source=f"describe_spot_price_history {zone}, {stamp.isoformat()}",
                                   **common))
    return rows, errors


def refresh(regions: list[str] | None = None, *, session=None, retry: Retry | None = None,
            pricing_region: str = PRICING_REGION) -> tuple[Path, list[CatalogRow], list[str]]:
    """Refresh the AWS catalog for `regions` (default: the catalog's regions) and write it.

    Rows of regions not refreshed stay as they were. Returns (path, rows written, errors).
    """
    base = bundled_rows(NAME)
    current, _ = load_provider(NAME)
    regions = sorted({check_region(r) for r in regions}) if regions else sorted({r.region for r in base})
    session = session or new_session(regions[0])
    retry = retry or Retry()
    # Clients are made here, in one thread (a boto3 Session is not thread-safe; its clients are).
    ec2 = {r: session.client("ec2", region_name=r, config=CLIENT_CONFIG) for r in regions}
    pricing = session.client("pricing", region_name=pricing_region, config=CLIENT_CONFIG)
    bundled = {(r.region, r.instance_type): r for r in base if not r.zone}
    today = clock.utc_now().date().isoformat()  # the UTC day, as every price age is counted

    results: dict[str, tuple[list[CatalogRow], list[str]]] = {}
    with ThreadPoolExecutor(max_workers=min(8, len(regions))) as pool:
        futures = {r: pool.submit(refresh_region, r, ec2[r], pricing, retry,
                                  [row for row in current if row.region == r], bundled, today) for r in regions}
        for r, fut in futures.items():
            results[r] = fut.result()

    errors = [e for r in regions for e in results[r][1]]
    failed = [r for r in regions if any(e.startswith(f"{r}: ec2 describe_instance_types") for e in results[r][1])]
    if len(failed) == len(regions):
        raise UserError("AWS catalog refresh failed in every region: " + results[regions[0]][1][0])
    rows = [row for row in current if row.region not in regions]
    for r in regions:
        rows.extend(results[r][0])
    rows.sort(key=lambda x: (x.region, x.instance_type, x.zone))
    path = write_refreshed(NAME, rows, errors)
    return path, rows, errors

