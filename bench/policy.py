"""Spot policies on the public spot traces, in the paper's setting, with the optimum as the limit.

Setting ("Can't Be Late", NSDI'24): C = 48 h, d = 0.2 h, spot 0.9731 $/h, on-demand 3.06 $/h,
C/R in {0.6, 0.7, 0.8, 0.9}, 300 random start points (the same for every policy). Each trace set
in ../shared/data/spot-traces is replayed single-zone (each file alone) and multi-zone (the files
of one instance kind across zones). Anchor: the paper reports 27-84% savings for Uniform Progress.

    python bench/policy.py [--starts 300] [--seed 0] [--jobs 2] [--data ../shared/data/spot-traces]

Prints one row per (files, mode, C/R): mean savings against on-demand and the fraction of
deadlines met per policy; `check` says whether sdcloud met every deadline and saved at least as
much as uniform-progress (single zone) or more (multi-zone). Traces with ticks under 300 s are
coarsened to the next multiple of their tick >= 300 s (a tick is available only if every fine tick
in it was) so that the optimum stays quick.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sdcloud.spot.simulate import PAPER, Setting, coarsen, load_trace, simulate, stack  # noqa: E402

RATIOS = (0.6, 0.7, 0.8, 0.9)
POLICIES = ["greedy", "uniform-progress", "sdcloud", "optimal"]
MIN_TICK = 300


def kind_of(stem: str) -> str:
    # us-west-2a_v100_1 -> v100_1: the instance kind; the zone is the part before the first "_".
    return stem.split("_", 1)[1] if "_" in stem else stem


def cells(data: Path) -> list[tuple[str, tuple[str, ...], bool]]:
    """(trace set, files, single_zone) for every file alone and every kind across >= 2 zones."""
    out = []
    for folder in sorted({p.parent for p in data.rglob("*.json")}):
        name = str(folder.relative_to(data))
        files = sorted(folder.glob("*.json"))
        for f in files:
            out.append((name, (str(f),), True))
        groups = defaultdict(list)
        for f in files:
            groups[kind_of(f.stem)].append(str(f))
        for group in groups.values():
            if len(group) > 1:
                out.append((name, tuple(group), False))
    return out


def run_cell(args: tuple) -> list[dict]:
    name, files, single, starts, seed = args
    traces = [load_trace(f) for f in files]
    gap = traces[0].gap_seconds
    if gap < MIN_TICK:
        tick = -(-MIN_TICK // gap) * gap
        traces = [coarsen(t, tick) for t in traces]
    avail, gap, keys = stack(traces)
    rows = []
    for ratio in RATIOS:
        c = PAPER["job_hours"]
        st = Setting(c, c / ratio, PAPER["restart_hours"], PAPER["spot_price"], PAPER["ondemand_price"])
        res = {r.policy: r for r in simulate(avail, keys, gap, st, POLICIES, starts=starts, seed=seed, single_zone=single)}
        rows.append({"set": name, "zones": "+".join(k.split("_", 1)[0] for k in keys), "kind": kind_of(keys[0]),
                     "mode": "single" if single else "multi", "ratio": ratio, "tick": gap,
                     **{p: (float(r.savings.mean()), float(r.met.mean())) for p, r in res.items()}})
    return rows


def verdict(row: dict) -> str:
    sd, up = row["sdcloud"], row["uniform-progress"]
    if sd[1] < 1.0:
        return "MISSED"
    if row["mode"] == "single":
        return "ok" if sd[0] >= up[0] - 1e-12 else "BELOW UP"
    return "ok" if sd[0] > up[0] else "NOT ABOVE UP"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "spot-traces")
    parser.add_argument("--starts", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    if not args.data.is_dir():
        sys.exit(f"{args.data} is absent: the shared spot traces are needed for this benchmark")
    began = time.perf_counter()
    work = [(n, f, s, args.starts, args.seed) for n, f, s in cells(args.data)]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = [row for chunk in pool.map(run_cell, work) for row in chunk]
    print(f"C = 48 h, d = 0.2 h, spot 0.9731 $/h, on-demand 3.06 $/h, {args.starts} starts (seed {args.seed}); "
          "savings vs on-demand, (deadlines met)")
    print("| trace set | zones | kind | mode | tick s | C/R | " + " | ".join(POLICIES) + " | check |")
    print("|---" * (7 + len(POLICIES)) + "|")
    for r in rows:
        cols = " | ".join(f"{100 * r[p][0]:.1f}% ({100 * r[p][1]:.0f}%)" for p in POLICIES)
        print(f"| {r['set']} | {r['zones']} | {r['kind']} | {r['mode']} | {r['tick']} | {r['ratio']:.1f} | {cols} | {verdict(r)} |")
    for mode in ("single", "multi"):
        sel = [r for r in rows if r["mode"] == mode]
        if sel:
            means = " ".join(f"{p} {100 * sum(r[p][0] for r in sel) / len(sel):.1f}%" for p in POLICIES)
            print(f"mean over {len(sel)} {mode}-zone rows: {means}")
    bad = [r for r in rows if verdict(r) != "ok"]
    print(f"sdcloud: {len(rows) - len(bad)}/{len(rows)} rows ok; anchor: the paper reports 27-84% savings for "
          f"uniform progress; {time.perf_counter() - began:.0f} s on {args.jobs} processes")


if __name__ == "__main__":
    main()
