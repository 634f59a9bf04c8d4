"""The bundled Vast.ai catalog (catalog.csv here) rebuilt from public figures (`python -m sdcloud.providers.build_catalogs`).

Input: shared/data/prices/vast_gpu_skypilot_catalog_v9-a5be538.csv, SkyPilot's public Vast.ai catalog
(catalogs/v9/vast/vms.csv at commit a5be538): one marketplace offer per GPU count and location, its
on-demand USD/h listed; no bids (its SpotPrice 0.00 means none listed). A row's region is the
location's continent code ("EU", "NA", "AS"), its zone the country code. The interruptible price is
the bid sdcloud would place on the estimated minimum bid (bids.py); bandwidth and disk are estimates
until a live `catalog refresh --provider vast` reads each machine's own figures.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ...offers.build_catalog import read_csv
from ...offers.catalog import CatalogRow
from ...offers.gpus import gpu_table
from . import bids
from .session import NAME

SNAPSHOT = "prices/vast_gpu_skypilot_catalog_v9-a5be538.csv"
SOURCE = ("Vast.ai marketplace on-demand USD/h as SkyPilot's public catalog records it (skypilot-org/skypilot-catalog, "
          "catalogs/v9/vast/vms.csv at a5be538; shared/data/prices); no publication date")
# The catalog's GPU names as gpus.csv names them (the 16 GB RTX 4060 Ti is the one SkyPilot calls RTX4060).
GPU_NAMES = {"RTX3090": "RTX3090", "RTX4090": "RTX4090", "RTX5090": "RTX5090", "RTXA6000": "RTXA6000",
             "L40S": "L40S", "A100": "A100", "H100": "H100", "RTX4060": "RTX4060Ti", "V100": "V100"}


def region_zone(location: str) -> tuple[str, str]:
    """("EU", "DK") from "Denmark, DK, EU"; a location without a country keeps its continent only."""
    parts = [p.strip() for p in location.split(",")]
    return (parts[-1] or "XX"), (parts[1] if len(parts) > 2 and parts[1] else "")


def build(shared: Path) -> list[CatalogRow]:
    path = shared / SNAPSHOT
    if not path.exists():
        return []
    table = gpu_table()
    rows: list[CatalogRow] = []
    for r in read_csv(path):
        gpu = GPU_NAMES.get(r["AcceleratorName"])
        if gpu is None or gpu not in table:
            continue  # no speed figure for the GPU
        info = ast.literal_eval(r["GpuInfo"])
        count = int(float(r["AcceleratorCount"]))
        mib = int(info["Gpus"][0]["MemoryInfo"]["SizeInMiB"]) // count
        if "80" in r["InstanceType"].split("-")[1] or (gpu == "A100" and mib > 50000):
            gpu = "A100-80GB" if gpu == "A100" else gpu
        if gpu == "H100" and mib > table["H100"].usable_mib:
            mib = table["H100"].usable_mib  # the NVL's 94 GB: taken as the SXM's figure (no NVL row in gpus.csv)
        od = float(r["Price"])
        region, zone = region_zone(r["Region"])
        min_bid = round(od * bids.SNAPSHOT_MIN_BID_SHARE, 4)
        bid = bids.bid_for(min_bid, margin=bids.DEFAULT_BID_MARGIN)
        bid_src = f"{bids.MIN_BID_SOURCE}; the bid: minimum x (1 + {bids.DEFAULT_BID_MARGIN:g}) ([vast] bid_margin)"
        rows.append(CatalogRow(
            provider=NAME, region=region, zone=zone, instance_type=r["InstanceType"], gpu=gpu, gpu_count=count,
            vram_gb=table[gpu].vram_gb, vcpus=int(float(r["vCPUs"])), memory_gb=float(r["MemoryGiB"]), nvme_gb=0.0,
            ondemand_price=od, spot_price=bid, currency="USD", interruption_band=None, snapshot_date="",
            ondemand_estimate=False, spot_estimate=True,
            source=f"on-demand: {SOURCE}; interruptible: {bid_src}; {bids.BANDWIDTH_SOURCE}; band: none published",
            vram_mib=min(mib, table[gpu].usable_mib) if table[gpu].usable_mib else mib, ondemand_basis="listed",
            spot_basis="estimate", ondemand_date="", spot_date="",
            ondemand_source="Vast.ai marketplace offer as SkyPilot's catalog v9 records it (no publication date)",
            spot_source=bid_src.replace("estimate: ", "estimate: bid = ", 1),
            min_bid=min_bid, upload_usd_per_gb=bids.SNAPSHOT_UPLOAD_USD_PER_GB,
            download_usd_per_gb=bids.SNAPSHOT_DOWNLOAD_USD_PER_GB,
            storage_usd_per_gb_month=bids.SNAPSHOT_STORAGE_USD_PER_GB_MONTH))
    rows.sort(key=lambda x: (x.gpu, x.gpu_count, x.region, x.zone, x.instance_type))
    return rows
