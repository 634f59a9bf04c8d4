"""Relative GPU throughput for Stable Diffusion work and usable memory (sdcloud/data/gpus.csv), A10G = 1.0.

Where each figure comes from: sdcloud/data/gpu_benchmarks.toml and docs/offers.md ("Speeds").
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import tomllib

from .kinds import RunKind

# How an inference figure was obtained (gpu_benchmarks.toml explains each).
SPEED_BASES = ("measured", "scaled", "estimate")


@dataclass(frozen=True)
class GpuPerf:
    gpu: str
    vram_gb: float  # nominal, per GPU
    usable_mib: int  # what the driver reports, per GPU
    train_rel: float
    infer_rel: float
    bf16: bool
    estimate: bool
    source: str
    infer_basis: str = "estimate"
    benchmark: str = ""
    from_gpu: str = ""
    train_basis: str = "compute part of a training step (overhead: train_rates.toml)"
    fp16_tflops: float = 0.0
    mem_bw_gbs: float = 0.0
    usable_mib_source: str = ""

    @property
    def usable_gb(self) -> float:
        """Usable memory in GiB, the unit tier floors are written in."""
        return self.usable_mib / 1024

    def speed_source(self) -> str:
        """One short line: where the inference figure comes from (for --explain)."""
        label = benchmarks()["benchmarks"].get(self.benchmark, {}).get("label", self.benchmark)
        if self.infer_basis == "measured":
            return f"measured: {label}"
        if self.infer_basis == "scaled":
            return f"scaled: {self.from_gpu} x {label} ratio"
        return f"estimate: {self.from_gpu} x datasheet rule"


@lru_cache(maxsize=1)
def gpu_table() -> dict[str, GpuPerf]:
    text = resources.files("sdcloud").joinpath("data/gpus.csv").read_text()
    table = {}
    for row in csv.DictReader(io.StringIO(text)):
        table[row["gpu"]] = GpuPerf(
            gpu=row["gpu"],
            vram_gb=float(row["vram_gb"]),
            usable_mib=int(row["usable_mib"]),
            train_rel=float(row["train_rel"]),
            infer_rel=float(row["infer_rel"]),
            bf16=row["bf16"] == "true",
            estimate=row["estimate"] == "true",
            source=row["datasheet"],
            infer_basis=row["infer_basis"],
            benchmark=row["benchmark"],
            from_gpu=row["from_gpu"],
            train_basis=row["train_basis"],
            fp16_tflops=float(row["fp16_tflops"]),
            mem_bw_gbs=float(row["mem_bw_gbs"]),
            usable_mib_source=row["usable_mib_source"],
        )
    return table


@lru_cache(maxsize=1)
def benchmarks() -> dict:
    """sdcloud/data/gpu_benchmarks.toml: the published figures behind gpus.csv, and the tolerance."""
    return tomllib.loads(resources.files("sdcloud").joinpath("data/gpu_benchmarks.toml").read_text())


def relative_speed(gpu: str, kind: str) -> float | None:
    """Compute speed of one `gpu` relative to an A10G; None if unknown. A training job's rate is not
    this figure times the reference rate: offers/rates.py adds the per-step overhead."""
    perf = gpu_table().get(gpu)
    if perf is None:
        return None
    return perf.train_rel if kind == RunKind.TRAIN else perf.infer_rel


def multi_gpu_speedup(count: int, kind: str) -> float:
    """Data-parallel speed-up of `count` GPUs.

    Batch generation splits perfectly (independent prompts). Training loses about 10% per
    doubling to gradient all-reduce on PCIe-connected cards, a conservative figure for
    LoRA-sized gradients (assumption, documented in docs/offers.md).
    """
    if count <= 1:
        return 1.0
    if kind == RunKind.BATCH:
        return float(count)
    efficiency = 0.9 ** (count.bit_length() - 1)
    return count * efficiency
