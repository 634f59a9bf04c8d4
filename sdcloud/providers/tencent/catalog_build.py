"""The bundled Tencent catalog (catalog.csv here) rebuilt from public figures (`python -m sdcloud.providers.build_catalogs`).

Inputs (docs/offers.md, "Tencent Cloud"):
  shared/data/prices/tencent_intl_gpu_payg_usd.csv   international-site pay-as-you-go USD
  catalog_sources.toml (here)                        documented zones, unpriced families
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from ... import config
from ...offers.build_catalog import read_csv
from ...offers.catalog import DEFAULT_SPOT_DISCOUNT, CatalogRow
from ...offers.gpus import gpu_table
from .session import NAME

TENCENT_INTL = "prices/tencent_intl_gpu_payg_usd.csv"
SOURCES = "catalog_sources.toml"
TENCENT_INTL_SOURCE = ("Tencent Cloud international site, GPU instance price overview, pay-as-you-go USD "
                       "(tencentyun/intlcloud-documents, Purchase Guide > Price Overview; shared/data/prices); "
                       "no publication date; region not stated (an older version named Guangzhou Zone 3)")
# Tencent's international site bills in USD everywhere; the mainland site in CNY. The overview is the
# only published figure, so mainland CNY is an estimate from it at sdcloud's default rate.
MAINLAND = ("ap-guangzhou", "ap-shanghai", "ap-beijing")
TENCENT_REGIONS = MAINLAND + ("ap-singapore",)


def _family(itype: str) -> str:
    return itype.split(".", 1)[0]


def build(shared: Path, cny_per_usd: float = config.DEFAULT_CNY_PER_USD,
          spot_discount: float = DEFAULT_SPOT_DISCOUNT) -> list[CatalogRow]:
    """The bundled catalog's rows from the shared reference data and catalog_sources.toml (the module docstring)."""
    src = tomllib.loads(resources.files(__package__).joinpath(SOURCES).read_text())
    zones: dict[str, list[str]] = src["zones"]
    names: dict[str, str] = src["gpu_names"]
    table = gpu_table()
    entries: list[dict] = []
    path = shared / TENCENT_INTL
    if path.exists():
        for r in read_csv(path):
            count = float(r["gpu_count"])
            gpu = names.get(r["gpu"])
            if gpu is None or gpu not in table or count < 1 or count != int(count):
                continue  # no speed figure for the GPU, or a slice of one
            entries.append({"type": r["instance_type"], "gpu": gpu, "gpu_count": int(count), "vcpus": int(r["vcpus"]),
                            "memory_gb": float(r["memory_gb"]), "usd": float(r["payg_usd_per_hour"])})
    for family, spec in src["unpriced"].items():
        for t in spec["types"]:
            entries.append({**t, "gpu": spec["gpu"], "cny": float(t["cny"])})
    spot_src = f"estimate: on-demand x (1 - {spot_discount:g}), the assumed Tencent spot discount ([tencent] spot_discount)"
    spot_cite = (f"{spot_src}; Tencent publishes no spot prices; the default is the median AWS GPU spot discount in "
                 "shared/data/prices")
    rows: list[CatalogRow] = []
    for e in entries:
        family = _family(e["type"])
        documented = zones.get(family, [])
        for region in TENCENT_REGIONS:
            in_region = [z for z in documented if z.rsplit("-", 1)[0] == region]
            if not in_region:
                continue  # Tencent does not document the family here
            zone_note = f"documented zones: {', '.join(in_region)} ({src['zones_source']})"
            if "usd" in e and region not in MAINLAND:
                od, cur, basis, od_src = e["usd"], "USD", "listed", "Tencent international price overview (no publication date)"
                od_cite = TENCENT_INTL_SOURCE
            elif "usd" in e:
                od, cur, basis = round(e["usd"] * cny_per_usd, 2), "CNY", "estimate"
                od_src = f"estimate: international USD {e['usd']:g} x {cny_per_usd:g} CNY/USD (no published CNY figure)"
                od_cite = f"{od_src}; {TENCENT_INTL_SOURCE}"
            elif region in MAINLAND:
                od, cur, basis = e["cny"], "CNY", "estimate"
                od_src = "estimate: unverified CNY figure, no published price"
                od_cite = f"estimate: {src['unpriced_source']}, in CNY"
            else:
                continue  # an unpriced family outside the mainland: nothing to base a figure on
            rows.append(CatalogRow(
                provider=NAME, region=region, zone="", instance_type=e["type"], gpu=e["gpu"],
                gpu_count=e["gpu_count"], vram_gb=table[e["gpu"]].vram_gb, vcpus=e["vcpus"], memory_gb=e["memory_gb"],
                nvme_gb=0.0, ondemand_price=od, spot_price=round(od * (1 - spot_discount), 4), currency=cur,
                interruption_band=None, snapshot_date="", ondemand_estimate=basis == "estimate", spot_estimate=True,
                source=f"on-demand: {od_cite}; spot: {spot_cite}; {zone_note}; band: none published (the middle band is assumed)",
                vram_mib=table[e["gpu"]].usable_mib, ondemand_basis=basis, spot_basis="estimate", ondemand_date="",
                spot_date="", ondemand_source=od_src, spot_source=spot_src))
    rows.sort(key=lambda x: (_family(x.instance_type), x.gpu_count, x.vcpus, x.instance_type, TENCENT_REGIONS.index(x.region)))
    return rows
