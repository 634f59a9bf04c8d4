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
                           [--flat-prices] [--only SUBSTRING] [--mode single|multi] [--cells]
                           [--cache FILE]

Per cell (with --cells): each policy's mean savings against on-demand, its mean cost relative to
Uniform Progress's ("vs UP": -3.0% = 3% cheaper), its share of the optimum's savings ("share"), and
deadlines met. Then per trace set and mode and over the whole grid: the average share (of the
averaged savings, and the mean of the cells' shares), the worst cell's share, the cells where
sdcloud saves less than Uniform Progress, and the deadlines sdcloud met. `check` per cell: sdcloud
met every deadline and, in a single zone, saved at least as much as Uniform Progress.

The optimum's costs do not depend on the policies, and they are most of the run time: --cache FILE
keeps them (keyed by files, cell, starts, seed and prices) so that a second run replays only the
online policies. Traces with ticks under 300 s are coarsened to the next multiple of their tick
>= 300 s (a tick is available only if every fine tick in it was) so that the optimum stays quick.
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

from sdcloud.spot.simulate import (OPTIMAL, PAPER, Setting, coarsen, load_trace, ondemand_by_zone,  # noqa: E402
                                   simulate, stack, stack_prices, stretch_series, with_prices)

JOBS = (24.0, 48.0)
DEADLINES = (52.0, 70.0)
RESTARTS_MIN = (3, 12)
SETTINGS = [(c, r, d) for c in JOBS for r in DEADLINES for d in RESTARTS_MIN]
ANCHOR = "uniform-progress"
OURS = "sdcloud"
POLICIES = [ANCHOR, "sdcloud-up", OURS]
MIN_TICK = 300
ONDEMAND = PAPER["ondemand_price"]


def kind_of(stem: str) -> str:
    # us-west-2a_v100_1 -> v100_1: the instance kind; the zone is the part before the first "_".
    return stem.split("_", 1)[1] if "_" in stem else stem


def groups(data: Path, only: str | None, mode: str | None = None) -> list[tuple[str, tuple[str, ...], bool]]:
    """(trace set, files, single_zone) for every file alone and every kind across >= 2 zones."""
    out = []
    for folder in sorted({p.parent for p in data.rglob("*.json")}):
        name = str(folder.relative_to(data))
        if only and only not in name:
            continue
        files = sorted(folder.glob("*.json"))
        if mode in (None, "single"):
            out.extend((name, (str(f),), True) for f in files)
        by_kind = defaultdict(list)
        for f in files:
            by_kind[kind_of(f.stem)].append(str(f))
        if mode in (None, "multi"):
            out.extend((name, tuple(g), False) for g in by_kind.values() if len(g) > 1)
    return out


def cell_key(name: str, files: tuple[str, ...], single: bool, c: float, r: float, d_min: int, starts: int, seed: int,
             priced: bool) -> str:
    # The trace set's name too: one zone's file name recurs across sets.
    return json.dumps([name, [Path(f).name for f in files], single, c, r, d_min, starts, seed, priced])


def run_group(args: tuple) -> list[dict]:
    """Every cell of one trace group: {policy: (mean savings, deadlines met, mean cost)} per cell."""
    name, files, single, starts, seed, series, policies, cached = args
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
        key = cell_key(name, files, single, c, r, d_min, starts, seed, prices is not None)
        wanted = list(policies) + ([] if key in cached else [OPTIMAL])
        res = {x.policy: (float(x.savings.mean()), float(x.met.mean()), float(x.costs.mean()))
               for x in simulate(avail, keys, gap, st, wanted, starts=starts, seed=seed, single_zone=single,
                                 spot_prices=prices, ondemand_prices=od)}
        res.setdefault(OPTIMAL, tuple(cached.get(key, (np.nan, np.nan, np.nan))))
        rows.append({"key": key, "set": name, "zones": "+".join(k.split("_", 1)[0] for k in keys),
                     "kind": kind_of(keys[0]), "mode": "single" if single else "multi", "C": c, "R": r, "d": d_min,
                     "tick": gap, "priced": prices is not None, **res})
    return rows


def share(row: dict, policy: str) -> float:
    """The policy's savings as a share of the optimum's (nan where the optimum saves nothing)."""
    opt = row[OPTIMAL][0]
    return row[policy][0] / opt if opt > 0 else float("nan")


def vs_anchor(row: dict, policy: str) -> float:
    """Mean cost relative to Uniform Progress's: -0.03 = 3% cheaper."""
    return row[policy][2] / row[ANCHOR][2] - 1


def verdict(row: dict) -> str:
    sd, up = row[OURS], row[ANCHOR]
    if sd[1] < 1.0:
        return "MISSED"
    if row["mode"] == "single" and sd[0] < up[0] - 1e-12:
        return "BELOW UP"
    return "ok"


def mean(rows: list[dict], key: str) -> float:
    return float(np.mean([r[key][0] for r in rows]))


def summary_line(label: str, sel: list[dict], policies: list[str]) -> str:
    opt = mean(sel, OPTIMAL)
    avgs = " | ".join(f"{100 * mean(sel, p):.1f}%" for p in policies)
    shares = [share(r, OURS) for r in sel]
    worst = min(sel, key=lambda r: share(r, OURS))
    below = sum(r["mode"] == "single" and r[OURS][0] < r[ANCHOR][0] - 1e-12 for r in sel)
    cost = float(np.mean([vs_anchor(r, OURS) for r in sel]))
    met = min(r[OURS][1] for r in sel)
    return (f"| {label} | {len(sel)} | {avgs} | {100 * opt:.1f}% | {100 * cost:+.1f}% | "
            f"{100 * mean(sel, OURS) / opt:.1f}% | {100 * float(np.nanmean(shares)):.1f}% | "
            f"{100 * share(worst, OURS):.1f}% ({worst['zones']} {worst['kind']} C{worst['C']:g} R{worst['R']:g} d{worst['d']}) | "
            f"{100 * mean(sel, ANCHOR) / opt:.1f}% | {below} | {100 * met:.0f}% |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "spot-traces")
    parser.add_argument("--prices", type=Path, default=ROOT.parent / "shared" / "data" / "spot-prices" / "v100_spot_prices.json")
    parser.add_argument("--flat-prices", action="store_true", help="every zone at the paper's flat spot price")
    parser.add_argument("--starts", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--only", help="only trace sets whose path contains this")
    parser.add_argument("--mode", choices=("single", "multi"), help="only single-zone or only multi-zone groups")
    parser.add_argument("--cells", action="store_true", help="print one row per cell")
    parser.add_argument("--cache", type=Path, help="JSON file that keeps the optimum's figures between runs")
    parser.add_argument("--smoke", action="store_true", help="a quick form for the test suite: one set, 2 starts")
    args = parser.parse_args()
    if args.smoke:
        args.starts, args.jobs, args.mode = 2, 1, "single"
        args.only = args.only or "aws-2022-10-26"
    if not args.data.is_dir():
        sys.exit(f"{args.data} is absent: the shared spot traces are needed for this benchmark")
    series = None
    if not args.flat_prices and args.prices.is_file():
        series = json.loads(args.prices.read_text())
    cached = json.loads(args.cache.read_text()) if args.cache and args.cache.is_file() else {}
    began = time.perf_counter()
    policies = POLICIES
    work = [(n, f, s, args.starts, args.seed, series, policies, cached) for n, f, s in groups(args.data, args.only, args.mode)]
    # The multi-zone groups run longest; start them first so the pool ends together.
    work.sort(key=lambda w: (w[2], -len(w[1])))
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = [row for chunk in pool.map(run_group, work) for row in chunk]
    if args.cache:
        cached.update({r["key"]: list(r[OPTIMAL]) for r in rows})
        args.cache.write_text(json.dumps(cached))
    rows.sort(key=lambda r: (r["mode"] != "single", r["set"], r["zones"], r["kind"], r["C"], r["R"], r["d"]))
    print(f"{args.starts} starts per cell (seed {args.seed}); savings vs on-demand {ONDEMAND} $/h; "
          f"spot prices: {'flat ' + str(PAPER['spot_price']) if series is None else 'per zone where known'}")
    others = [p for p in policies if p != ANCHOR]
    if args.cells:
        print("| set | zones | kind | mode | C h | R h | d min | tick s | UP | optimal (vs UP) | "
              + " | ".join(f"{p} (vs UP, share)" for p in others) + " | UP share | met (UP) | met (sdcloud) | check |")
        print("|---" * (14 + len(others)) + "|")
        for r in rows:
            cols = " | ".join(f"{100 * r[p][0]:.1f}% ({100 * vs_anchor(r, p):+.1f}%, {100 * share(r, p):.0f}%)" for p in others)
            print(f"| {r['set']} | {r['zones']} | {r['kind']} | {r['mode']} | {r['C']:g} | {r['R']:g} | {r['d']} | {r['tick']} | "
                  f"{100 * r[ANCHOR][0]:.1f}% | {100 * r[OPTIMAL][0]:.1f}% ({100 * vs_anchor(r, OPTIMAL):+.1f}%) | {cols} | "
                  f"{100 * share(r, ANCHOR):.0f}% | {100 * r[ANCHOR][1]:.0f}% | {100 * r[OURS][1]:.0f}% | {verdict(r)} |")
        print()
    print("| trace set / mode | cells | " + " | ".join(policies) + " | optimal | sdcloud cost vs UP | "
          "sdcloud/opt (of averages) | sdcloud/opt (mean of cells) | worst cell | UP/opt | cells below UP | "
          "met (sdcloud, worst cell) |")
    print("|---" * (10 + len(policies)) + "|")
    for mode in ("single", "multi"):
        for name in sorted({r["set"] for r in rows}):
            sel = [r for r in rows if r["mode"] == mode and r["set"] == name]
            if sel:
                print(summary_line(f"{name} / {mode}", sel, policies))
    for mode in ("single", "multi"):
        sel = [r for r in rows if r["mode"] == mode]
        if sel:
            print(summary_line(f"**grid average, {mode} zone**", sel, policies))
    bad = [r for r in rows if verdict(r) != "ok"]
    print(f"sdcloud: {len(rows) - len(bad)}/{len(rows)} cells ok; {time.perf_counter() - began:.0f} s on {args.jobs} processes")


if __name__ == "__main__":
    main()
