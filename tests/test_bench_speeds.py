"""The GPU benches feed the catalog: what they measured as the `sdcloud speeds add` line, which
records the figure when run."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

import pytest

from sdcloud.cli import main
from sdcloud.runs.records.state import StateStore
from sdcloud.speeds import records

ROOT = Path(__file__).resolve().parents[1]
# A script's neighbour, not a package: loaded from its file as the benches load it beside them.
_SPEC = importlib.util.spec_from_file_location("speed_lines", ROOT / "bench" / "speed_lines.py")
speed_lines = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(speed_lines)


@pytest.mark.parametrize("device, name", [
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H200", "H100"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100"), ("NVIDIA L40S", "L40S"), ("NVIDIA A10G", "A10G"), ("NVIDIA L4", "L4"),
    ("Tesla T4", "T4"), ("Tesla V100-SXM2-32GB", "V100-32GB"), ("Tesla V100-SXM2-16GB", "V100"),
    ("NVIDIA GeForce RTX 4090", None),
])
def test_torch_device_names_map_to_the_gpu_table(device, name):
    assert speed_lines.gpu_name(device) == name


def test_the_printed_line_records_the_figure(capsys, sdcloud_home):
    speed_lines.emit("NVIDIA H200", "sdxl-lora", 2.4012, "bench/train_gpu.py (no checkpointing)", False,
                     trainer="builtin")
    line = capsys.readouterr().out.strip()
    assert line.startswith("speeds: sdcloud speeds add --gpu H100 --tier sdxl-lora --rate 2.401 ")
    argv = shlex.split(line.removeprefix("speeds: sdcloud "))
    assert main(argv) == 0
    (row,) = records.rows(StateStore())
    assert (row.gpu, row.tier, row.rate, row.trainer, row.origin) == ("H100", "sdxl-lora", 2.401, "builtin", "recorded")
    assert "NVIDIA H200" in row.note and "bench/train_gpu.py" in row.note


def test_an_unknown_gpu_or_no_rate_gives_no_line(capsys):
    speed_lines.emit("NVIDIA GeForce RTX 4090", "sdxl-lora", 3.0, "bench", False)
    assert "nothing to record" in capsys.readouterr().out
    assert speed_lines.speeds_args("NVIDIA L40S", "sdxl-lora", 0.0, "bench") is None
