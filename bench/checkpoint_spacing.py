"""The largest tier's checkpoints on spot: Young/Daly spacing against fixed intervals, on the shared traces.

A sdxl-finetune save (the UNet's fp32 state, 10.3 GB, and the fp16 model file, 6.9 GB: about
17 GB) takes 17 s to write locally at 1 GB/s and 126 s to upload at the agent's measured
135.6 MB/s (docs/host-agent.md): 143 s. That does not fit a 30 s notice, nor AWS's 120 s with the
host's margin (sdcloud_agent/checkpoint_spacing.py), so every reclaim loses the work since the last
durable periodic checkpoint. The simulator (sdcloud/spot/simulate.py, Setting.notice_hours) replays
that loss; this bench compares the periodic interval:

- `notice save durable`: today's accounting, the save at the notice always finishes (the bound);
- `young-daly`: sqrt(2 x save x mean between reclaims), the mean from the zones' advisor band
  (p3.2xlarge in us-east-1 and us-west-2: band 4, 2 h; sdcloud/spot/checkpoint_spacing.py);
- fixed intervals: the run's default (an eighth of the job), 1 h, 10 min.

    python bench/checkpoint_spacing.py [--starts 40] [--seed 0] [--notice 30] [--save 143]
                                       [--data ../shared/data/spot-traces/preemption/aws-2023-04-22-v100]

The preemption traces record when kept-alive p3.2xlarge hosts were reclaimed: the reclaims are real.
Each zone alone, the `sdcloud` policy, C = 24 h, R = 52 h, d = 12 min, on-demand 3.06 $/h, spot
0.9731 $/h. Prints per interval: mean cost, savings against on-demand, deadlines met, reclaims, work
lost per reclaim (mean over all reclaims; the worst job's mean).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sdcloud.spot.checkpoint_spacing import band_mean_hours, young_daly_hours  # noqa: E402
from sdcloud.spot.policy import get_policy  # noqa: E402
from sdcloud.spot.simulate import PAPER, Setting, choose_starts, coarsen, load_trace, replay, stack  # noqa: E402

SAVE_S = 17.0 + 17_000 / 135.6  # local write at 1 GB/s + upload at 135.6 MB/s, 17 GB
JOB, DEADLINE, RESTART = 24.0, 52.0, 0.2
BAND = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path,
                        default=ROOT.parent / "shared" / "data" / "spot-traces" / "preemption" / "aws-2023-04-22-v100")
    parser.add_argument("--starts", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--notice", type=float, default=30.0, help="reclaim notice, seconds")
    parser.add_argument("--save", type=float, default=SAVE_S, help="seconds for a durable save")
    parser.add_argument("--smoke", action="store_true", help="a quick form for the test suite: one zone, 2 starts")
    args = parser.parse_args()
    files = sorted(args.data.glob("*.json"))
    if args.smoke:
        files, args.starts = files[:1], 2
    if not files:
        sys.exit(f"{args.data} holds no traces: the shared spot traces are needed for this benchmark")
    save, notice = args.save / 3600, args.notice / 3600
    mean = band_mean_hours(BAND)
    tau = young_daly_hours(save, mean)
    choices = [("notice save durable", None, None), (f"young-daly ({60 * tau:.0f} min)", notice, tau),
               ("fixed: an eighth of the job (3 h)", notice, JOB / 8), ("fixed 1 h", notice, 1.0),
               ("fixed 10 min", notice, 1 / 6)]
    print(f"save {args.save:.0f} s, notice {args.notice:.0f} s, mean between reclaims {mean:g} h (band {BAND}); "
          f"C {JOB:g} h, R {DEADLINE:g} h, d {60 * RESTART:.0f} min; {len(files)} zones x {args.starts} starts")
    print("| interval | mean cost $ | savings | met | reclaims | work lost per reclaim, h (mean; worst job) |")
    print("|---|---|---|---|---|---|")
    for label, nt, every in choices:
        st = Setting(JOB, DEADLINE, RESTART, PAPER["spot_price"], PAPER["ondemand_price"],
                     save_hours=save, notice_hours=nt, checkpoint_hours=every)
        costs, met, reclaims, lost, worst = [], [], 0, 0.0, 0.0
        for f in files:
            t = load_trace(f)
            if t.gap_seconds < 300:
                t = coarsen(t, -(-300 // t.gap_seconds) * t.gap_seconds)
            avail, gap, keys = stack([t])
            begin, _ = choose_starts(avail.shape[1], 1, st, gap, args.starts, args.seed)
            for s in begin:
                o = replay(get_policy("sdcloud"), avail, keys, gap, int(s), 0, st)
                costs.append(o.cost)
                met.append(o.deadline_met(st))
                reclaims += o.reclaims
                lost += o.lost_hours
                worst = max(worst, o.lost_hours / o.reclaims if o.reclaims else 0.0)
        full = JOB * PAPER["ondemand_price"]
        per = lost / reclaims if reclaims else 0.0
        print(f"| {label} | {np.mean(costs):.2f} | {100 * (1 - np.mean(costs) / full):.1f}% | "
              f"{100 * np.mean(met):.0f}% | {reclaims} | {per:.2f}, {worst:.2f} |")


if __name__ == "__main__":
    main()
