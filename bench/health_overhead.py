"""Benchmark: what the agent's health sampling (sdcloud_agent/health.py) costs a training run.

The same local run (the agent, the builtin trainer, the tiny model on this machine's device) twice:
once with sampling off (SDCLOUD_HEALTH_SECONDS=-1) and once sampling every --every seconds (the
default is 5 s; a shorter interval magnifies the cost). Each run's step time is the median of its
trainer's own `step_s` figures after the first --warmup steps. The sampler's own time per sample
(nvidia-smi where the host has it, /proc/<pid>/io reads) comes from the run's status.json.

    python bench/health_overhead.py [--steps 40] [--every 1] [--warmup 5] [--rounds 2]

The last line: health_overhead steps=<n> every_s=<s> off_step_s=<a> on_step_s=<b> delta_pct=<d>
sampler_ms=<m> samples=<k> sampler_pct_of_step=<q> nvidia_smi=<yes|no>. delta_pct compares the two
runs' median step times (noise on a shared machine is of the same order); sampler_pct_of_step is
the sampler's own time per second of training, as a share of a step: what sampling can cost at most.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_once(tmp: Path, steps: int, every: float) -> tuple[list[float], dict]:
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = {"run_id": "bench", "attempt": 1, "trainer": "builtin", "model": "tiny", "trainer_args": {},
           "steps": steps, "checkpoint_every": steps, "keep_checkpoints": 1,
           "store": {"url": f"file://{tmp}/bucket"}, "metadata": {"kind": "none"},
           "workdir": str(tmp / "work"), "nvme": False, "require_gpu": False,
           "heartbeat_seconds": 2, "poll_seconds": 1}
    (tmp / "agent.json").write_text(json.dumps(cfg))
    env = {**os.environ, "SDCLOUD_HEALTH_SECONDS": str(every),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "bootstrap"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "sdcloud_agent", "run", "--config", str(tmp / "agent.json")],
                          env=env, capture_output=True, timeout=3600)
    log = (tmp / "work" / "attempt-1.log").read_text(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"the run failed (exit {proc.returncode}):\n{log[-2000:]}")
    steps_s = []
    for line in log.splitlines():
        i = line.find("SDCLOUD_STEP ")
        if i >= 0:
            doc = json.loads(line[i + len("SDCLOUD_STEP "):])
            if doc.get("step_s"):
                steps_s.append(float(doc["step_s"]))
    status = json.loads((tmp / "bucket" / "runs" / "bench" / "status.json").read_text())
    return steps_s, status.get("health") or {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=float, default=1.0, help="seconds between samples in the sampled run")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="off/on pairs, alternated (noise on a shared machine)")
    ap.add_argument("--smoke", action="store_true", help="a quick form for the test suite: 3 steps, one round")
    a = ap.parse_args()
    if a.smoke:
        a.steps, a.warmup, a.rounds = 3, 1, 1
    tmp = Path(tempfile.mkdtemp(prefix="sdcloud-health-bench-"))
    off_all, on_all, health = [], [], {}
    try:
        for r in range(a.rounds):
            off, _ = run_once(tmp / f"off-{r}", a.steps, -1)
            on, health = run_once(tmp / f"on-{r}", a.steps, a.every)
            off_all += off[a.warmup:]
            on_all += on[a.warmup:]
            print(f"round {r + 1}: off median {statistics.median(off[a.warmup:]):.4f} s/step, "
                  f"on median {statistics.median(on[a.warmup:]):.4f} s/step", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    off_s, on_s = statistics.median(off_all), statistics.median(on_all)
    sampler_ms = health.get("sampler_ms") or 0.0
    # The sampler runs sampler_ms every `every` seconds on its own thread: its share of a step.
    pct_of_step = 100.0 * (sampler_ms / 1000.0) / a.every
    print(f"sampling off: median step {off_s:.4f} s over {len(off_all)} steps")
    print(f"sampling on (every {a.every:g} s): median step {on_s:.4f} s over {len(on_all)} steps; "
          f"{health.get('samples')} samples of {sampler_ms} ms each")
    print(f"health_overhead steps={a.steps} every_s={a.every:g} off_step_s={off_s:.4f} on_step_s={on_s:.4f} "
          f"delta_pct={100.0 * (on_s - off_s) / off_s:.2f} sampler_ms={sampler_ms} samples={health.get('samples')} "
          f"sampler_pct_of_step={pct_of_step:.3f} nvidia_smi={'yes' if shutil.which('nvidia-smi') else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
