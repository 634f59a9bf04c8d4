"""bench/train_gpu.py without a GPU: a clear message and exit 1; its published UNet configs build
the real models (checked on the meta device: shapes only, no memory)."""

from __future__ import annotations

import runpy
import subprocess
import sys

from tests.support import ROOT



def test_without_cuda_it_says_so_and_exits_1():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "train_gpu.py")], capture_output=True, text=True,
                          timeout=120, env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin",
                                            "PYTHONPATH": f"{ROOT}:{ROOT / 'bootstrap'}"})
    assert proc.returncode == 1 and "needs a CUDA GPU" in proc.stderr and not proc.stdout


def test_the_published_configs_build_full_size_unets():
    import torch
    from diffusers import UNet2DConditionModel

    train_gpu = runpy.run_path(str(ROOT / "bench" / "train_gpu.py"))  # its globals: a script, not a package

    with torch.device("meta"):
        sd15 = UNet2DConditionModel(**train_gpu["SD15_UNET"])
        sdxl = UNet2DConditionModel(**train_gpu["SDXL_UNET"])
    # About 860 M and 2.57 G parameters: the published sizes of the SD 1.5 and SDXL UNets.
    assert 855e6 < sum(p.numel() for p in sd15.parameters()) < 865e6
    assert 2.55e9 < sum(p.numel() for p in sdxl.parameters()) < 2.58e9
