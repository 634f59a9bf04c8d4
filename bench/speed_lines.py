"""What a GPU bench measured, as the `sdcloud speeds add` line that records it (or recorded at once
with --record), so that the figures of a bench run feed the optimizer on this machine.

Shared by bench/train_gpu.py and bench/batch_gpu.py; imports nothing heavy.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time

# torch's device names against the names of sdcloud/data/gpus.csv, most specific first. An H200
# has an H100's Hopper compute (sdcloud/data/train_rates.toml): its figures stand for an H100's,
# and the note says it was an H200.
NAMES = (("A100", "80GB", "A100-80GB"), ("V100", "32GB", "V100-32GB"), ("H200", "", "H100"), ("H100", "", "H100"),
         ("L40S", "", "L40S"), ("A100", "", "A100"), ("V100", "", "V100"), ("A10G", "", "A10G"), ("A10", "", "A10"),
         ("L4", "", "L4"), ("T4", "", "T4"))


def gpu_name(device: str) -> str | None:
    """The gpus.csv name of a torch device name ("NVIDIA H100 80GB HBM3" -> H100); None if sdcloud knows none."""
    words = device.upper().replace("-", " ").split()
    for model, extra, name in NAMES:
        if model in words and (not extra or extra in words or extra in device.upper()):
            return name
    return None


def speeds_args(device: str, tier: str, rate: float, what: str, trainer: str | None = None) -> list[str] | None:
    """The `sdcloud speeds add` arguments that record `rate` for `tier` on this device; None for an unknown GPU."""
    gpu = gpu_name(device)
    if gpu is None or not rate > 0:
        return None
    note = f"{what} on {device}, {time.strftime('%Y-%m-%d')}"
    args = ["speeds", "add", "--gpu", gpu, "--tier", tier, "--rate", f"{rate:.4g}", "--note", note]
    return args + (["--trainer", trainer] if trainer else [])


def emit(device: str, tier: str, rate: float, what: str, record: bool, trainer: str | None = None) -> None:
    """Print the line (`speeds: sdcloud speeds add ...`), or with `record` run it here."""
    args = speeds_args(device, tier, rate, what, trainer)
    if args is None:
        print(f"speeds: {device} is not in sdcloud's GPU table (sdcloud/data/gpus.csv): nothing to record", flush=True)
        return
    if record:
        proc = subprocess.run([sys.executable, "-m", "sdcloud.cli", *args], capture_output=True, text=True)
        print(f"speeds: {(proc.stdout or proc.stderr).strip()}", flush=True)
        return
    print("speeds: sdcloud " + " ".join(shlex.quote(a) for a in args), flush=True)
