"""Spot policies on the public spot traces over a grid of jobs, with the offline optimum as the limit.

The grid (after the cant-be-late suite): job C in {24, 48} h, deadline R in {52, 70} h, restart d in
{3, 12} min, on every trace set in ../shared/data/spot-traces, each file alone (single zone) and
the files of one instance kind across zones (multi-zone). Every policy replays the same random
start points of each cell.

Prices: each zone's own spot series where one is known: ../shared/data/spot-prices/
v100_spot_prices.json for the p3.2xlarge (v100_1) zones it covers (its ticks carry no timestamps,
so the series is stretched over the trace), else the trace's own `prices`, else the paper's flat
0.9731 $/h; on-demand 3.06 $/h in every region here (AWS lists p3.2xlarge at 3.06 $/h in us-east-1,
us-east-2 and us-west-2). Savings are against on-demand at that price.

    python bench/policy.py [--starts 60] [--seed 0] [--jobs 2] [--data ../shared/data/spot-traces]
                           [--flat-prices] [--only SUBSTRING]

Prints one row per cell, then the averages per trace set and mode and over the whole grid: mean
savings of uniform-progress (the anchor, "Can't Be Late", NSDI'24), sdcloud-up (sdcloud's previous
rule: Uniform Progress over every zone), sdcloud and the optimum,
sdcloud's share of the optimum's savings, and the fraction of deadlines met. `check` per cell:
sdcloud met every deadline, and in a single zone saved at least as much as uniform-progress.
Traces with ticks under 300 s are coarsened to the next multiple of their tick >= 300 s (a tick is
available only if every fine tick in it was) so that the optimum stays quick.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sdcloud.spot.simulate import (PAPER, Setting, coarsen, load_trace, ondemand_by_zone, simulate,  # noqa: E402
                                   stack, stack_prices, stretch_series, with_prices)

JOBS = (24.0, 48.0)
DEADLINES = (52.0, 70.0)
RESTARTS_MIN = (3, 12)
SETTINGS = [(c, r, d) for c in JOBS for r in DEADLINES for d in RESTARTS_MIN]
POLICIES = ["uniform-progress", "sdcloud-up", "sdcloud", "optimal"]
MIN_TICK = 300
ONDEMAND = PAPER["ondemand_price"]


def kind_of(stem: str) -> str:
    # us-west-2a_v100_1 -> v100_1: the instance kind; the zone is the part before the first "_".
    return stem.split("_", 1)[1] if "_" in stem else stem


def groups(data: Path, only: str | None) -> list[tuple[str, tuple[str, ...], bool]]:
    """(trace set, files, single_zone) for every file alone and every kind across >= 2 zones."""
    out = []
    for folder in sorted({p.parent for p in data.rglob("*.json")}):
        name = str(folder.relative_to(data))
        if only and only not in name:
            continue
        files = sorted(folder.glob("*.json"))
        for f in files:
            out.append((name, (str(f),), True))
        by_kind = defaultdict(list)
        for f in files:
            by_kind[kind_of(f.stem)].append(str(f))
        for group in by_kind.values():
            if len(group) > 1:
                out.append((name, tuple(group), False))
    return out


def run_group(args: tuple) -> list[dict]:
    name, files, single, starts, seed, series = args
    traces = []
    for f in files:
        t = load_trace(f)
        if series and t.key in series:
            t = with_prices(t, stretch_series(series[t.key], len(t.avail)))
        traces.append(t)
    gap = traces[0].gap_seconds
    if gap < MIN_TICK:
        traces = [coarsen(t, -(-MIN_TICK // gap) * gap) for t in traces]
    avail, gap, keys = stack(traces)
    prices = stack_prices(traces, PAPER["spot_price"])
    od = ondemand_by_zone(keys, ONDEMAND)
    rows = []
    for c, r, d_min in SETTINGS:
        st = Setting(c, r, d_min / 60, PAPER["spot_price"], ONDEMAND)
        res = {x.policy: x for x in simulate(avail, keys, gap, st, POLICIES, starts=starts, seed=seed, single_zone=single,
                                             spot_prices=prices, ondemand_prices=od)}
        rows.append({"set": name, "zones": "+".join(k.split("_", 1)[0] for k in keys), "kind": kind_of(keys[0]),
                     "mode": "single" if single else "multi", "C": c, "R": r, "d": d_min, "tick": gap,
                     "priced": prices is not None,
                     **{p: (float(x.savings.mean()), float(x.met.mean())) for p, x in res.items()}})
    return rows


def verdict(row: dict) -> str:
    sd, up = row["sdcloud"], row["uniform-progress"]
    if sd[1] < 1.0:
        return "MISSED"
    if row["mode"] == "single" and sd[0] < up[0] - 1e-12:
        return "BELOW UP"
    return "ok"


def mean(rows: list[dict], key: str) -> float:
    return float(np.mean([r[key][0] for r in rows]))


def summary_line(label: str, sel: list[dict]) -> str:
    up, prev, sd, opt = (mean(sel, p) for p in POLICIES)
    closed = (sd - up) / (opt - up) if opt > up else float("nan")
    met = min(r["sdcloud"][1] for r in sel)
    ok = sum(verdict(r) == "ok" for r in sel)
    return (f"| {label} | {len(sel)} | {100 * up:.1f}% | {100 * prev:.1f}% | {100 * sd:.1f}% | {100 * opt:.1f}% | {100 * sd / opt:.1f}% | "
            f"{100 * up / opt:.1f}% | {100 * closed:.0f}% | {100 * met:.0f}% | {ok}/{len(sel)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "spot-traces")
    parser.add_argument("--prices", type=Path, default=ROOT.parent / "shared" / "data" / "spot-prices" / "v100_spot_prices.json")
    parser.add_argument("--flat-prices", action="store_true", help="every zone at the paper's flat spot price")
    parser.add_argument("--starts", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--only", help="only trace sets whose path contains this")
    args = parser.parse_args()
    if not args.data.is_dir():
        sys.exit(f"{args.data} is absent: the shared spot traces are needed for this benchmark")
    series = None
    if not args.flat_prices and args.prices.is_file():
        series = json.loads(args.prices.read_text())
    began = time.perf_counter()
    work = [(n, f, s, args.starts, args.seed, series) for n, f, s in groups(args.data, args.only)]
    # The multi-zone groups run longest; start them first so the pool ends together.
    work.sort(key=lambda w: (w[2], -len(w[1])))
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = [row for chunk in pool.map(run_group, work) for row in chunk]
    rows.sort(key=lambda r: (r["mode"] != "single", r["set"], r["zones"], r["kind"], r["C"], r["R"], r["d"]))
    print(f"{args.starts} starts per cell (seed {args.seed}); savings vs on-demand {ONDEMAND} $/h; "
          f"spot prices: {'flat ' + str(PAPER['spot_price']) if series is None else 'per zone where known'}")
    print("| set | zones | kind | mode | C h | R h | d min | tick s | UP | sdcloud-up | sdcloud | optimal | sdcloud/opt | "
          "UP/opt | met (UP) | met (sdcloud) | check |")
    print("|---" * 17 + "|")
    for r in rows:
        up, sd, opt = r["uniform-progress"], r["sdcloud"], r["optimal"]
        share = f"{100 * sd[0] / opt[0]:.0f}%" if opt[0] > 0 else "-"
        up_share = f"{100 * up[0] / opt[0]:.0f}%" if opt[0] > 0 else "-"
        print(f"| {r['set']} | {r['zones']} | {r['kind']} | {r['mode']} | {r['C']:g} | {r['R']:g} | {r['d']} | {r['tick']} | "
              f"{100 * up[0]:.1f}% | {100 * r['sdcloud-up'][0]:.1f}% | {100 * sd[0]:.1f}% | {100 * opt[0]:.1f}% | {share} | {up_share} | {100 * up[1]:.0f}% | "
              f"{100 * sd[1]:.0f}% | {verdict(r)} |")
    print()
    print("| trace set / mode | cells | UP | sdcloud-up | sdcloud | optimal | sdcloud/opt | UP/opt | gap closed | met (sdcloud, worst cell) | check |")
    print("|---" * 11 + "|")
    for mode in ("single", "multi"):
        for name in sorted({r["set"] for r in rows}):
            sel = [r for r in rows if r["mode"] == mode and r["set"] == name]
            if sel:
                print(summary_line(f"{name} / {mode}", sel))
    for mode in ("single", "multi"):
        sel = [r for r in rows if r["mode"] == mode]
        if sel:
            print(summary_line(f"**grid average, {mode} zone**", sel))
    bad = [r for r in rows if verdict(r) != "ok"]
    print(f"sdcloud: {len(rows) - len(bad)}/{len(rows)} cells ok; anchor: the paper reports 27-84% savings for "
          f"uniform progress; {time.perf_counter() - began:.0f} s on {args.jobs} processes")


if __name__ == "__main__":
    main()
