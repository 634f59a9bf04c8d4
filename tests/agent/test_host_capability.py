"""Hosts by compute capability (issue 46): torch 2.13's CUDA 13.0 build has no kernels below Turing
(7.5), so a V100 (7.0: AWS p3, Tencent GN10Xp) host installs the CUDA 12.6 build, which has Volta's
kernels, whatever CUDA its driver runs; a GPU no build has kernels for is refused at boot in one line."""

from __future__ import annotations

import subprocess

import pytest


def _host(driver_cuda: str, caps: list[str]):
    """nvidia-smi as a host answers: its banner with the driver's CUDA, and each GPU's compute_cap."""
    def run(cmd, **kw):
        if "--query-gpu=compute_cap" in cmd:
            return subprocess.CompletedProcess(cmd, 0, "\n".join(caps) + "\n", "")
        return subprocess.CompletedProcess(cmd, 0, f"| NVIDIA-SMI 580.65.06  Driver Version: 580.65.06  "
                                                   f"CUDA Version: {driver_cuda}     |\n", "")
    return run


@pytest.mark.parametrize("driver, caps, build", [
    ("13.0", ["7.0"], "cu126"),          # a V100 under a CUDA 13 driver: cu130 would find no kernel
    ("12.2", ["7.0"], "cu126"),          # a V100 on Tencent's 535 image
    ("13.0", ["7.5"], "cu130"),          # a T4 runs the newest build
    ("13.0", ["8.6", "7.0"], "cu126"),   # the build must run on every GPU of the host
    ("13.0", ["9.0"], "cu130"),
])
def test_a_host_s_torch_build_has_kernels_for_its_gpus(driver, caps, build):
    from sdcloud_agent import gpu

    assert gpu.host_torch_build(run=_host(driver, caps)) == build


def test_a_v100_host_s_install_plan_takes_the_cuda_12_6_build_from_its_index(monkeypatch):
    from sdcloud_agent import boot, gpu

    monkeypatch.delenv("SDCLOUD_TORCH_INDEX_URL", raising=False)
    build = gpu.host_torch_build(run=_host("13.0", ["7.0"]))
    assert boot.torch_install_args(build) == [boot.TORCH_PIN, "--index-url", "https://download.pytorch.org/whl/cu126"]
    assert "-cu126-" in boot.env_key(build)[0]  # its own cached environment, not the cu130 one
    # A Turing host under the same driver takes PyPI's own CUDA 13.0 wheel.
    assert boot.torch_install_args(gpu.host_torch_build(run=_host("13.0", ["7.5"]))) == [boot.TORCH_PIN]


def test_a_gpu_no_build_has_kernels_for_is_refused():
    from sdcloud_agent import gpu

    with pytest.raises(ValueError, match="compute capability 3.7"):
        gpu.host_torch_build(run=_host("12.2", ["3.7"]))  # a K80
    assert gpu.BUILD_MIN_CAPABILITY["cu130"] == 7.5 and gpu.BUILD_MIN_CAPABILITY["cu126"] <= 7.0
