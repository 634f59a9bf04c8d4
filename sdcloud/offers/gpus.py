"""Relative GPU throughput for Stable Diffusion work (sdcloud/data/gpus.csv), A10G = 1.0."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources


@dataclass(frozen=True)
class GpuPerf:
    gpu: str
    vram_gb: float
    train_rel: float
    infer_rel: float
    bf16: bool
    estimate: bool
    source: str


@lru_cache(maxsize=1)
def gpu_table() -> dict[str, GpuPerf]:
    text = resources.files("sdcloud").joinpath("data/gpus.csv").read_text()
    table = {}
    for row in csv.DictReader(io.StringIO(text)):
        table[row["gpu"]] = GpuPerf(
            gpu=row["gpu"],
            vram_gb=float(row["vram_gb"]),
            train_rel=float(row["train_rel"]),
            infer_rel=float(row["infer_rel"]),
            bf16=row["bf16"] == "true",
            estimate=row["estimate"] == "true",
            source=row["source"],
        )
    return table


def relative_speed(gpu: str, kind: str) -> float | None:
    """Throughput of one `gpu` relative to an A10G for a "train" or "batch" job; None if unknown."""
    perf = gpu_table().get(gpu)
    if perf is None:
        return None
    return perf.train_rel if kind == "train" else perf.infer_rel


def multi_gpu_speedup(count: int, kind: str) -> float:
    """Data-parallel speed-up of `count` GPUs.

    Batch generation splits perfectly (independent prompts). Training loses about 10% per
    doubling to gradient all-reduce on PCIe-connected cards, a conservative figure for
    LoRA-sized gradients (assumption, documented in docs/offers.md).
    """
    if count <= 1:
        return 1.0
    if kind == "batch":
        return float(count)
    efficiency = 0.9 ** (count.bit_length() - 1)
    return count * efficiency
