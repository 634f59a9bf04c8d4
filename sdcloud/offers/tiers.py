"""Workload tiers: what a job needs from a host, loaded from sdcloud/data/tiers.toml."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

import tomllib

from .gpus import gpu_table
from .kinds import RunKind


@dataclass(frozen=True)
class Tier:
    name: str
    description: str
    kind: RunKind  # TRAIN: job size in steps; BATCH: job size in images
    min_vram_gb: float
    rec_vram_gb: float
    gpu_count: int
    vcpus: int
    memory_gb: float
    nvme_gb: float
    job_size: int  # steps or images
    resolution: int
    batch_size: int
    ref_rate: float  # steps/s or images/s on the reference GPU (A10G)
    family: str = "sd15"  # model family: sd15, sd2, sdxl or sd3 (SD3 and SD3.5)
    base_model: str = ""  # the default --model on paid providers (a hub id)
    mode: str = "lora"  # the builtin trainer's --mode: lora or dreambooth (full UNet)
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def gpus_fit(self) -> list[str]:
        """GPUs whose usable memory (as the driver reports it) meets the tier's floor, smallest first."""
        fit = [g for g in gpu_table().values() if g.usable_gb >= self.min_vram_gb]
        return [g.gpu for g in sorted(fit, key=lambda g: (g.usable_mib, g.gpu))]

    @property
    def unit(self) -> str:
        return "steps" if self.kind is RunKind.TRAIN else "images"

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "kind": self.kind,
            "min_vram_gb": self.min_vram_gb,
            "rec_vram_gb": self.rec_vram_gb,
            "gpu_count": self.gpu_count,
            "vcpus": self.vcpus,
            "memory_gb": self.memory_gb,
            "nvme_gb": self.nvme_gb,
            self.unit: self.job_size,
            "resolution": self.resolution,
            "batch_size": self.batch_size,
            "ref_rate": self.ref_rate,
            "ref_gpu": "A10G",
            "vram_compared": "usable MiB as the driver reports it",
            "gpus_fit": self.gpus_fit(),
            "family": self.family,
            "base_model": self.base_model,
            "sources": dict(self.sources),
        }


def _tier(name: str, raw: dict) -> Tier:
    try:
        kind = RunKind(raw["kind"])
    except ValueError:
        raise ValueError(f"tier {name}: kind must be train or batch") from None
    return Tier(
        name=name,
        description=raw["description"],
        kind=kind,
        min_vram_gb=float(raw["min_vram_gb"]),
        rec_vram_gb=float(raw["rec_vram_gb"]),
        gpu_count=int(raw["gpu_count"]),
        vcpus=int(raw["vcpus"]),
        memory_gb=float(raw["memory_gb"]),
        nvme_gb=float(raw["nvme_gb"]),
        job_size=int(raw["steps"] if kind is RunKind.TRAIN else raw["images"]),
        resolution=int(raw["resolution"]),
        batch_size=int(raw["batch_size"]),
        ref_rate=float(raw["ref_rate"]),
        family=str(raw.get("family", "sd15")),
        base_model=str(raw.get("base_model", "")),
        mode=str(raw.get("mode", "lora")),
        sources=dict(raw.get("sources", {})),
    )


@lru_cache(maxsize=1)
def all_tiers() -> dict[str, Tier]:
    text = resources.files("sdcloud").joinpath("data/tiers.toml").read_text()
    data = tomllib.loads(text)["tiers"]
    return {name: _tier(name, raw) for name, raw in data.items()}


def get_tier(name: str) -> Tier:
    """The tier by name, in any case (`SDXL-LoRA`); a near miss gets a "did you mean"."""
    from ..names import match_name

    tiers = all_tiers()
    return tiers[match_name(name, tiers, "tier")]
