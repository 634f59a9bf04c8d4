"""CUDA and VRAM: read the GPUs with nvidia-smi and check the tier's VRAM minimum."""

from __future__ import annotations

import csv
import io
import logging
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger("sdcloud_agent.gpu")

QUERY = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv"]
UTIL_QUERY = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]


@dataclass(frozen=True)
class Gpu:
    name: str
    vram_mib: int
    driver: str

    @property
    def vram_gb(self) -> float:
        return self.vram_mib / 1024


@dataclass
class GpuCheck:
    ok: bool
    gpus: list[Gpu]
    reason: str = ""
    warnings: list[str] = field(default_factory=list)


def compute_capability() -> float | None:
    """The first GPU's CUDA compute capability (8.6 for an A10G, 7.5 for a T4), or None."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
        return float(out.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def parse(csv_text: str) -> list[Gpu]:
    """Parse `nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv` (header optional)."""
    gpus = []
    for row in csv.reader(io.StringIO(csv_text)):
        if len(row) < 3 or row[0].strip().lower() == "name":
            continue
        m = re.match(r"\s*(\d+)", row[1])
        if not m:
            continue
        gpus.append(Gpu(row[0].strip(), int(m.group(1)), row[2].strip()))
    return gpus


def check(gpus: list[Gpu], min_vram_gb: float = 0, rec_vram_gb: float = 0, require_gpu: bool = True) -> GpuCheck:
    """Refuse below the minimum VRAM (per GPU: training runs data-parallel), warn below the recommended."""
    if not gpus:
        if require_gpu:
            return GpuCheck(False, [], "no NVIDIA GPU found (nvidia-smi missing or reports none)")
        return GpuCheck(True, [], warnings=["no GPU: running on the CPU"])
    smallest = min(g.vram_gb for g in gpus)
    name = next(g.name for g in gpus if g.vram_gb == smallest)
    if min_vram_gb and smallest + 0.5 < min_vram_gb:  # 0.5 GB slack: drivers reserve a little
        return GpuCheck(False, gpus, f"{name} has {smallest:.1f} GB VRAM; this tier needs at least {min_vram_gb:g} GB")
    warnings = []
    if rec_vram_gb and smallest + 0.5 < rec_vram_gb:
        warnings.append(f"{name} has {smallest:.1f} GB VRAM, below the recommended {rec_vram_gb:g} GB: expect a smaller batch or slower steps")
    return GpuCheck(True, gpus, warnings=warnings)


def query(run: Callable = subprocess.run) -> list[Gpu]:
    if run is subprocess.run and shutil.which("nvidia-smi") is None:
        return []
    try:
        out = run(QUERY, capture_output=True, text=True, timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        log.warning("nvidia-smi failed: %s", exc)
        return []
    return parse(out)


def utilisation(run: Callable = subprocess.run) -> float | None:
    """Mean GPU utilisation in percent, or None without a GPU."""
    if run is subprocess.run and shutil.which("nvidia-smi") is None:
        return None
    try:
        out = run(UTIL_QUERY, capture_output=True, text=True, timeout=10, check=True).stdout
        vals = [float(x) for x in out.split() if x.strip().replace(".", "").isdigit()]
        return sum(vals) / len(vals) if vals else None
    except (subprocess.SubprocessError, OSError, ValueError):
        return None
