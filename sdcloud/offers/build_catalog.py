"""Rebuild the bundled catalog (sdcloud/data/catalog/aws.csv, tencent.csv) from public figures.

    python -m sdcloud.offers.build_catalog [--shared ../shared/data] [--check]

Inputs (docs/offers.md, "Where every number comes from"):
  aws      shared/data/prices/aws_gpu_regions_skypilot_catalog.csv   on-demand + per-zone spot quotes, 5 regions
           shared/data/prices/aws_us-east-1_ondemand_<date>.csv       AWS Price List, us-east-1, dated
           shared/data/spot-advisor/gpu_linux_interruption_savings.csv interruption band per region/type
           sdcloud/data/aws_instance_facts.csv                        local NVMe and the types missing above
  tencent  shared/data/prices/tencent_intl_gpu_payg_usd.csv           international-site pay-as-you-go USD
           sdcloud/data/tencent_sources.toml                          documented zones, unpriced families

It also recomputes the speed columns of sdcloud/data/gpus.csv from sdcloud/data/gpu_benchmarks.toml
and the datasheet columns (build_gpus). Every row names its source and date per market; a figure computed from others is marked
"derived" with the formula, one with no published figure "estimate" with its basis, a missing
one "none". --check compares the result with the bundled files and exits 1 if they differ
(tests/offers/test_offers.py runs it).
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import statistics
import sys
import tomllib
from importlib import resources
from pathlib import Path

from .. import config
from .catalog import DEFAULT_TENCENT_SPOT_DISCOUNT, ROW_FIELDS, CatalogRow
from .gpus import gpu_table

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SHARED = REPO.parent / "shared" / "data"

SKYPILOT = "prices/aws_gpu_regions_skypilot_catalog.csv"
ADVISOR = "spot-advisor/gpu_linux_interruption_savings.csv"
TENCENT_INTL = "prices/tencent_intl_gpu_payg_usd.csv"
# The SkyPilot snapshot carries no date. It has AWS's June 2025 P4d/P5 prices, so it is no older than
# that: rows are dated 2025-06-01, the earliest it can be, so that their age is never understated.
SKYPILOT_DATE = "2025-06-01"
SKYPILOT_SOURCE = ("SkyPilot catalog snapshot (skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv, built from the AWS "
                   "Price List and describe_spot_price_history; shared/data/prices); snapshot date not recorded, dated "
                   f"{SKYPILOT_DATE}, the earliest it can be (it carries AWS's June 2025 P4d/P5 prices)")
ADVISOR_SOURCE = "AWS Spot Instance Advisor snapshot 2025-06 (shared/data/spot-advisor)"
TENCENT_INTL_SOURCE = ("Tencent Cloud international site, GPU instance price overview, pay-as-you-go USD "
                       "(tencentyun/intlcloud-documents, Purchase Guide > Price Overview; shared/data/prices); "
                       "no publication date; region not stated (an older version named Guangzhou Zone 3)")
# Tencent's international site bills in USD everywhere; the mainland site in CNY. The overview is the
# only published figure, so mainland CNY is an estimate from it at sdcloud's default rate.
MAINLAND = ("ap-guangzhou", "ap-shanghai", "ap-beijing")
TENCENT_REGIONS = MAINLAND + ("ap-singapore",)


def _data(name: str) -> str:
    return resources.files("sdcloud").joinpath(f"data/{name}").read_text()


def _read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _ondemand_list(shared: Path) -> tuple[dict[str, float], str, str]:
    """The dated us-east-1 list prices: ({type: usd}, date, file name)."""
    files = sorted((shared / "prices").glob("aws_us-east-1_ondemand_*.csv"))
    if not files:
        return {}, "", ""
    path = files[-1]
    stamp = re.search(r"(\d{4}-\d{2}-\d{2})", path.name)
    prices = {r["instance_type"]: float(r["ondemand_usd_per_hour"]) for r in _read_csv(path)}
    return prices, stamp.group(1) if stamp else "", path.name


def _usable_mib(gpu: str, reported: int | None) -> int:
    """The smaller of what EC2 reports (the usable figure for A10G/L4/L40S) and the driver's figure."""
    table = gpu_table().get(gpu)
    driver = table.usable_mib if table else 0
    return min(x for x in (reported, driver) if x) if (reported or driver) else 0


def _fmt(x: float) -> str:
    return f"{x:.4f}".rstrip("0").rstrip(".")


def build_aws(shared: Path) -> list[CatalogRow]:
    sky = _read_csv(shared / SKYPILOT)
    listed, listed_date, listed_file = _ondemand_list(shared)
    listed_source = f"AWS Price List, us-east-1, generated {listed_date}"
    listed_cite = (f"{listed_source} into aws/karpenter-provider-aws pkg/providers/pricing/zz_generated.pricing_aws.go "
                   f"(shared/data/prices/{listed_file})")
    bands = {(r["region"], r["instance_type"]): int(r["interruption_range_index"]) for r in _read_csv(shared / ADVISOR)}
    facts = {r["instance_type"]: r for r in csv.DictReader(io.StringIO(_data("aws_instance_facts.csv")))}
    rows: list[CatalogRow] = []
    seen: set[tuple[str, str]] = set()

    def make(itype: str, region: str, gpu: str, count: int, vcpus: int, memory: float, reported_mib: int | None,
             od: float | None, od_src: str, od_cite: str, od_date: str, quotes: list[float]) -> CatalogRow:
        fact = facts.get(itype)
        if fact is None:
            raise SystemExit(f"{itype}: no row in sdcloud/data/aws_instance_facts.csv (local NVMe unknown)")
        if quotes:
            spot = round(statistics.median(quotes), 4)
            spot_basis = "derived"
            spot_src = f"median of {len(quotes)} zone quotes ({_fmt(min(quotes))}-{_fmt(max(quotes))}), SkyPilot snapshot"
            spot_date = SKYPILOT_DATE
        else:
            spot, spot_basis, spot_date = None, "none", ""
            spot_src = "no spot quote for this region and type in the sources"
        band = bands.get((region, itype))
        band_src = f"band: {ADVISOR_SOURCE}" if band is not None else "band: not in the advisor snapshot (the middle band is assumed)"
        dates = [d for d in (od_date, spot_date) if d]
        return CatalogRow(
            provider="aws", region=region, zone="", instance_type=itype, gpu=gpu, gpu_count=count,
            vram_gb=gpu_table()[gpu].vram_gb, vcpus=vcpus, memory_gb=memory, nvme_gb=float(fact["nvme_gb"]),
            ondemand_price=od, spot_price=spot, currency="USD", interruption_band=band,
            snapshot_date=min(dates) if dates else "", ondemand_estimate=False, spot_estimate=False,
            source=(f"on-demand: {od_cite}; spot: {spot_src}" + (f" (zone names not kept) in the {SKYPILOT_SOURCE}" if quotes else "")
                    + f"; {band_src}; NVMe: {fact['source']}"),
            vram_mib=_usable_mib(gpu, reported_mib), ondemand_basis="listed" if od is not None else "none",
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
    # on-demand only; facts from aws_instance_facts.csv.
    for itype, price in sorted(listed.items()):
        if ("us-east-1", itype) in seen:
            continue
        fact = facts.get(itype)
        if fact is None:
            raise SystemExit(f"{itype}: no row in sdcloud/data/aws_instance_facts.csv")
        rows.append(make(itype, "us-east-1", fact["gpu"], int(fact["gpu_count"]), int(fact["vcpus"]),
                         float(fact["memory_gb"]), None, price, listed_source, listed_cite + f"; facts: {fact['source']}",
                         listed_date, []))
    rows.sort(key=lambda x: (x.instance_type.split(".")[0], x.gpu_count, x.vcpus, x.instance_type, x.region))
    return rows


def _family(itype: str) -> str:
    return itype.split(".", 1)[0]


def build_tencent(shared: Path, cny_per_usd: float = config.DEFAULT_CNY_PER_USD,
                  spot_discount: float = DEFAULT_TENCENT_SPOT_DISCOUNT) -> list[CatalogRow]:
    src = tomllib.loads(_data("tencent_sources.toml"))
    zones: dict[str, list[str]] = src["zones"]
    names: dict[str, str] = src["gpu_names"]
    table = gpu_table()
    entries: list[dict] = []
    path = shared / TENCENT_INTL
    if path.exists():
        for r in _read_csv(path):
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
                provider="tencent", region=region, zone="", instance_type=e["type"], gpu=e["gpu"],
                gpu_count=e["gpu_count"], vram_gb=table[e["gpu"]].vram_gb, vcpus=e["vcpus"], memory_gb=e["memory_gb"],
                nvme_gb=0.0, ondemand_price=od, spot_price=round(od * (1 - spot_discount), 4), currency=cur,
                interruption_band=None, snapshot_date="", ondemand_estimate=basis == "estimate", spot_estimate=True,
                source=f"on-demand: {od_cite}; spot: {spot_cite}; {zone_note}; band: none published (the middle band is assumed)",
                vram_mib=table[e["gpu"]].usable_mib, ondemand_basis=basis, spot_basis="estimate", ondemand_date="",
                spot_date="", ondemand_source=od_src, spot_source=spot_src))
    rows.sort(key=lambda x: (_family(x.instance_type), x.gpu_count, x.vcpus, x.instance_type, TENCENT_REGIONS.index(x.region)))
    return rows


def to_csv(rows: list[CatalogRow]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(ROW_FIELDS), lineterminator="\n")
    writer.writeheader()
    for r in rows:
        d = r.as_dict()
        d = {k: ("" if v is None else (str(v).lower() if isinstance(v, bool) else v)) for k, v in d.items()}
        writer.writerow(d)
    return out.getvalue()


def build_gpus(reference: str = "A10G") -> str:
    """sdcloud/data/gpus.csv with infer_rel/train_rel recomputed from gpu_benchmarks.toml and the datasheet columns.

    The one rule (gpu_benchmarks.toml): measured/scaled = the from_gpu's figure x the benchmark's ratio;
    estimate = the from_gpu's figure x sqrt(dense FP16 TFLOPS ratio x memory bandwidth ratio). The GPU
    measured without a from_gpu anchors the chain; all figures are then divided by the reference's.
    """
    text = _data("gpus.csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    by = {r["gpu"]: r for r in rows}
    bench = tomllib.loads(_data("gpu_benchmarks.toml"))["benchmarks"]
    raw: dict[str, float] = {}

    def resolve(gpu: str, seen: tuple[str, ...] = ()) -> float:
        if gpu in raw:
            return raw[gpu]
        if gpu in seen:
            raise SystemExit(f"gpus.csv: from_gpu loop through {gpu}")
        r = by[gpu]
        frm = r["from_gpu"]
        if not frm:
            if r["infer_basis"] != "measured":
                raise SystemExit(f"gpus.csv: {gpu} has no from_gpu and is not the measured anchor")
            value = 1.0
        elif r["infer_basis"] in ("measured", "scaled"):
            values = bench[r["benchmark"]]["values"]
            value = resolve(frm, seen + (gpu,)) * values[gpu] / values[frm]
        else:
            b = by[frm]
            ratio = (float(r["fp16_tflops"]) / float(b["fp16_tflops"])) * (float(r["mem_bw_gbs"]) / float(b["mem_bw_gbs"]))
            value = resolve(frm, seen + (gpu,)) * ratio ** 0.5
        raw[gpu] = value
        return value

    ref = resolve(reference)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for r in rows:
        rel = f"{resolve(r['gpu']) / ref:.3f}"
        writer.writerow({**r, "infer_rel": rel, "train_rel": rel,
                         "estimate": "false" if r["infer_basis"] == "measured" else "true"})
    return out.getvalue()


def build_all(shared: Path) -> dict[str, str]:
    """{provider: CSV text} as the bundled files must read."""
    return {"aws": to_csv(build_aws(shared)), "tencent": to_csv(build_tencent(shared))}


def bundled_path(provider: str) -> Path:
    return REPO / "sdcloud" / "data" / "catalog" / f"{provider}.csv"


GPUS_PATH = "sdcloud/data/gpus.csv"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sdcloud.offers.build_catalog", description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=DEFAULT_SHARED, help="the shared reference data folder")
    parser.add_argument("--check", action="store_true", help="compare with the bundled files instead of writing them")
    args = parser.parse_args(argv)
    if not (args.shared / SKYPILOT).exists():
        print(f"error: {args.shared / SKYPILOT} is absent: the shared reference data is needed", file=sys.stderr)
        return 2
    built = build_all(args.shared)
    stale = []
    gpus_text, gpus_path = build_gpus(), REPO / GPUS_PATH
    if args.check:
        if not gpus_path.exists() or gpus_path.read_text() != gpus_text:
            stale.append(str(gpus_path))
    elif gpus_path.read_text() != gpus_text:
        gpus_path.write_text(gpus_text)
        gpu_table.cache_clear()
        built = build_all(args.shared)  # usable MiB and names come from gpus.csv
        print(f"wrote {gpus_path}")
    for provider, text in built.items():
        path = bundled_path(provider)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
            print(f"wrote {path} ({text.count(chr(10)) - 1} rows)")
    if stale:
        print("error: not the build's output (run python -m sdcloud.offers.build_catalog): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
