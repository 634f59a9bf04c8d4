"""CUDA and VRAM: read the GPUs with nvidia-smi and check the tier's VRAM minimum."""

from __future__ import annotations

import csv
import io
import logging
import os
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


# nvidia-smi reports the memory left after the driver's and ECC's reserve, not the GPU's nominal
# size: a "16 GB" T4 shows 15,360 MiB (93.75%), a 24 GB A10G 23,028 MiB (93.7%), a 40 GB A100
# 40,960 MiB. So a tier's "N GB" is compared as a usable floor of N GiB x USABLE_FRACTION.
USABLE_FRACTION = 0.93


def usable_floor_mib(nominal_gb: float) -> int:
    """The least MiB nvidia-smi shows on a GPU sold as `nominal_gb` GB."""
    return int(nominal_gb * 1024 * USABLE_FRACTION)


def check(gpus: list[Gpu], min_vram_gb: float = 0, rec_vram_gb: float = 0, require_gpu: bool = True) -> GpuCheck:
    """Refuse below the minimum VRAM (per GPU: training runs data-parallel), warn below the recommended."""
    if not gpus:
        if require_gpu:
            return GpuCheck(False, [], "no NVIDIA GPU found (nvidia-smi missing or reports none)")
        return GpuCheck(True, [], warnings=["no GPU: running on the CPU"])
    smallest_mib = min(g.vram_mib for g in gpus)
    smallest = smallest_mib / 1024
    name = next(g.name for g in gpus if g.vram_mib == smallest_mib)
    if min_vram_gb and smallest_mib < usable_floor_mib(min_vram_gb):
        return GpuCheck(False, gpus, f"{name} has {smallest_mib} MiB usable VRAM, below the {usable_floor_mib(min_vram_gb)} MiB "
                        f"floor of a {min_vram_gb:g} GB GPU this tier needs", )
    warnings = []
    if rec_vram_gb and smallest_mib < usable_floor_mib(rec_vram_gb):
        warnings.append(f"{name} has {smallest:.1f} GB VRAM, below the recommended {rec_vram_gb:g} GB: "
                        "expect a smaller batch or slower steps")
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


# Torch CUDA builds of the pinned torch (boot.TORCH_PIN, 2.13.0) that download.pytorch.org
# publishes, as (CUDA version, wheel index tag), oldest first: its stable builds are CUDA 12.6 and
# 13.0 (PyTorch's release compatibility matrix, https://github.com/pytorch/pytorch/blob/main/RELEASE.md;
# there is no cu128 index for it). A driver runs every build whose CUDA is not newer than the "CUDA
# Version" nvidia-smi prints, so a 12.8 driver takes cu126; within CUDA 12 a driver >= 525.60 also
# runs newer 12.x builds (NVIDIA's minor version compatibility), so a 12.0-12.5 driver (Tencent's
# 525/535 images) still gets cu126. Check this list against the index when the pin changes.
TORCH_CUDA_BUILDS = (((12, 6), "cu126"), ((13, 0), "cu130"))
# The lowest compute capability each build carries kernels for (the same matrix, release 2.11 on:
# CUDA 12.6.3 builds Maxwell 5.0, Pascal 6.0, Volta 7.0 up to Hopper; CUDA 12.8 and 13.0 start at
# Turing 7.5, as CUDA 13 itself cannot target older GPUs). So a V100 (7.0: AWS p3, Tencent GN10Xp)
# takes cu126 even under a CUDA 13 driver: cu130 would install and then find no kernel to run.
BUILD_MIN_CAPABILITY = {"cu126": 5.0, "cu130": 7.5}
TORCH_INDEX = "https://download.pytorch.org/whl/"


def torch_index(build: str) -> str:
    """The wheel index of a torch build: the run's torch_index_url (network.py) or PyTorch's."""
    base = os.environ.get("SDCLOUD_TORCH_INDEX_URL") or TORCH_INDEX
    return base.rstrip("/") + "/" + build


def driver_cuda(nvidia_smi_text: str) -> tuple[int, int] | None:
    """The highest CUDA version the driver supports, from plain `nvidia-smi` output."""
    m = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", nvidia_smi_text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def torch_build(cuda: tuple[int, int] | None, capability: float | None = None) -> str:
    """The wheel index tag for this driver and GPU: `cu126`, `cu130`, or `cpu` without a GPU: the
    newest build the driver runs that has kernels for the GPU's compute capability (None: unknown,
    any). Raises ValueError for a driver too old for every build, or a GPU no build has kernels for."""
    if cuda is None:
        return "cpu"
    builds = [(v, tag) for v, tag in TORCH_CUDA_BUILDS if capability is None or capability >= BUILD_MIN_CAPABILITY[tag]]
    if not builds:
        raise ValueError(f"no torch build of {', '.join(t for _, t in TORCH_CUDA_BUILDS)} has kernels for a GPU "
                         f"of compute capability {capability:g}: use a newer GPU")
    fitting = [tag for version, tag in builds if version <= cuda]
    if fitting:
        return fitting[-1]
    same_major = [tag for version, tag in builds if version[0] == cuda[0]]
    if same_major:
        return same_major[0]
    raise ValueError(f"the NVIDIA driver supports CUDA {cuda[0]}.{cuda[1]}, older than every torch build "
                     f"for this GPU ({', '.join(t for _, t in builds)}); use an image with a newer driver")


def host_torch_build(run: Callable = subprocess.run) -> str:
    if run is subprocess.run and shutil.which("nvidia-smi") is None:
        return "cpu"
    try:
        out = run(["nvidia-smi"], capture_output=True, text=True, timeout=60).stdout
    except (subprocess.SubprocessError, OSError):
        return "cpu"
    return torch_build(driver_cuda(out), lowest_capability(run))


def lowest_capability(run: Callable = subprocess.run) -> float | None:
    """The lowest compute capability among the host's GPUs (the build must run on each), or None."""
    try:
        out = run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                  text=True, timeout=30).stdout
        caps = [float(x) for x in out.split()]
    except (subprocess.SubprocessError, OSError, ValueError):
        return None
    return min(caps) if caps else None
