"""Every bench runs: `python bench/X.py --help` exits 0, and its quick form (`--smoke`: tiny sizes, one
round) runs to its last line, as a user runs it from a checkout (docs/agent.md, "Benchmarks").

The benches import the tests' helpers from where they live (tests/support); when a helper moves,
this test fails instead of the bench, the next time someone needs its figures. A GPU bench on a
machine without CUDA says so in one line and measures nothing; that is its quick form here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHES = sorted(p.stem for p in (ROOT / "bench").glob("*.py"))
# A module the GPU benches share, not a bench: tests/test_bench_speeds.py runs what it does.
LIBRARIES = {"speed_lines"}
# Each bench's last line starts with its name (the figure a doc quotes), some with another word.
LAST_WORD = {"store_listing": "listing", "checkpoint_tuning": "tune", "checkpoint_spacing": "|", "policy": "sdcloud:",
             "train_gpu": "speeds:", "batch_gpu": "speeds:"}
GPU = {"train_gpu", "batch_gpu"}
SHARED_TRACES = {"policy", "checkpoint_spacing"}  # they replay ../shared/data/spot-traces
SLOW = {"batch", "health_overhead", "checkpoint_sync"}


def _run(name: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a user runs it: the bench sets its path
    return subprocess.run([sys.executable, str(ROOT / "bench" / f"{name}.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_every_bench_is_in_the_lists():
    assert set(BENCHES) >= LIBRARIES | GPU | SHARED_TRACES | SLOW
    assert len(BENCHES) >= 12


@pytest.mark.parametrize("name", BENCHES)
def test_a_bench_shows_its_help(name):
    got = _run(name, "--help", timeout=120)
    assert got.returncode == 0 and "Traceback" not in got.stderr, got.stderr[-3000:]
    if name not in LIBRARIES:
        assert "--smoke" in got.stdout


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                  for n in BENCHES if n not in LIBRARIES])
def test_a_bench_runs_its_quick_form(name):
    if name in SHARED_TRACES and not (ROOT.parent / "shared" / "data" / "spot-traces").is_dir():
        pytest.skip("../shared/data/spot-traces is absent: the shared traces are needed for this bench")
    got = _run(name, "--smoke", timeout=300)
    assert "Traceback" not in got.stderr, got.stderr[-3000:]
    if name in GPU and got.returncode != 0:
        lines = got.stderr.strip().splitlines()
        assert len(lines) == 1 and "nothing measured" in lines[0], got.stderr
        return
    assert got.returncode == 0, (got.stdout[-2000:], got.stderr[-3000:])
    last = got.stdout.strip().splitlines()[-1]
    assert last.startswith(LAST_WORD.get(name, name)), last
