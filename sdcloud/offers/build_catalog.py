"""The pieces every provider's catalog build shares, and sdcloud/data/gpus.csv's speed columns.

    python -m sdcloud.providers.build_catalogs [--shared ../shared/data] [--check]

rebuilds every bundled catalog (each provider's `catalog_build.py`, named by its traits) and
gpus.csv. This module recomputes the speed columns of sdcloud/data/gpus.csv from
sdcloud/data/gpu_benchmarks.toml and the datasheet columns (build_gpus), and writes rows as the
bundled CSV reads (to_csv). Every row names its source and date per market; a figure computed from
others is marked "derived" with the formula, one with no published figure "estimate" with its
basis, a missing one "none" (docs/offers.md, "Where every number comes from").
"""

from __future__ import annotations

import csv
import io
import tomllib
from importlib import resources
from pathlib import Path

from .catalog import MARKET_FIELDS, ROW_FIELDS, CatalogRow
from .gpus import gpu_table


def _data(name: str) -> str:
    return resources.files("sdcloud").joinpath(f"data/{name}").read_text()


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def usable_mib(gpu: str, reported: int | None) -> int:
    """The smaller of what EC2 reports (the usable figure for A10G/L4/L40S) and the driver's figure."""
    table = gpu_table().get(gpu)
    driver = table.usable_mib if table else 0
    return min(x for x in (reported, driver) if x) if (reported or driver) else 0


def fmt(x: float) -> str:
    return f"{x:.4f}".rstrip("0").rstrip(".")


def to_csv(rows: list[CatalogRow]) -> str:
    out = io.StringIO()
    blank = CatalogRow.__dataclass_fields__
    unused = {f for f in MARKET_FIELDS if all(getattr(r, f) == blank[f].default for r in rows)}
    writer = csv.DictWriter(out, fieldnames=[f for f in ROW_FIELDS if f not in unused], lineterminator="\n",
                            extrasaction="ignore")
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
