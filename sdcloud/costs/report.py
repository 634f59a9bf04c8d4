"""`sdcloud cost report`: runs added up from the ledger, as a table, JSON, CSV or HTML.

Every format is made from the one dict `build_report` returns, with amounts already rounded to
ledger.DECIMALS, so that the table, the CSV and the HTML print exactly the JSON's numbers.
"""

from __future__ import annotations

import csv
import io
import time
from datetime import datetime, timezone

from .. import config
from ..errors import UserError
from ..offers.kinds import RunKind
from .ledger import DECIMALS, run_cost, savings

FORMATS = ("table", "json", "csv", "html")
GROUPINGS = ("tier", "provider", "day")
ITEMS = ("compute", "disk", "bucket", "requests")


def select_runs(state, run_ids: tuple[str, ...] | list[str] = (), since_seconds: float | None = None,
                all_runs: bool = False, now: float | None = None) -> list[dict]:
    """The runs a report covers: named ones (every name must exist), those since a time, or all."""
    if run_ids:
        runs = []
        for rid in run_ids:
            found = state.get_run(rid)
            if found is None:
                raise UserError(f"no run {rid!r}; see: sdcloud status")
            runs.append(found)
        return runs
    runs = state.list_runs()
    if all_runs or since_seconds is None:
        return runs
    cutoff = (now or time.time()) - since_seconds
    return [r for r in runs if r["created"] >= cutoff or r["updated"] >= cutoff]


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d")


def _is_batch(run: dict) -> bool:
    return isinstance(run.get("spec"), dict) and RunKind.of(run["spec"]) is RunKind.BATCH


def build_report(state, runs: list[dict], by: str | None = None, now: float | None = None,
                 images: dict[str, int] | None = None) -> dict:
    """`images`: each batch job's images made so far (batch.status.images_done), by job id; a job
    not in it counts the images its row last recorded."""
    from .. import clock

    now = now or clock.epoch()
    if by is not None and by not in GROUPINGS:
        raise UserError(f"--by must be one of {', '.join(GROUPINGS)}, got {by!r}")
    from .job_terms import in_job_terms

    per_run = [in_job_terms(state, run_cost(state, r, now=now), r, (images or {}).get(r["id"])) if _is_batch(r)
               else run_cost(state, r, now=now) for r in runs]
    totals = {k: round(sum(r[k] for r in per_run), DECIMALS)
              for k in ("estimate_usd", "total_usd", "lost_hours", "hours", "lost_usd")}
    # Savings over the runs whose on-demand counterfactual is known (a batch job's may not be).
    known = [r for r in per_run if r["ondemand_usd"] is not None]
    totals["ondemand_usd"] = round(sum(r["ondemand_usd"] for r in known), DECIMALS)
    totals["runs"] = len(per_run)
    totals["attempts"] = sum(len(r["attempts"]) for r in per_run)
    totals["reclaims"] = sum(r["reclaims"] for r in per_run)
    totals.update(savings(sum(r["total_usd"] for r in known), totals["ondemand_usd"]))
    totals["savings_over_runs"] = len(known)
    from .losses import add_losses  # minutes lost per cause, priced (costs/losses.py)

    add_losses(state, per_run, totals, now)
    currencies = sorted({c for r in per_run for c in r["currencies"]} - {"USD"})
    out = {
        "generated": now, "currency": "USD",
        # How amounts billed in another currency were converted (sdcloud/config.py usd_per).
        "rates": {c: {"usd_per_unit": round(config.usd_per(c), 6)} for c in currencies},
        "runs": per_run, "totals": totals,
    }
    if by:
        groups: dict[str, dict] = {}
        for r in per_run:
            key = {"tier": r["tier"], "provider": r["provider"] or "", "day": _day(r["created"])}[by]
            g = groups.setdefault(key, {"key": key, "runs": 0, "total_usd": 0.0, "ondemand_usd": 0.0, "savings_usd": 0.0,
                                        "lost_hours": 0.0, "known_usd": 0.0})
            g["runs"] += 1
            for k in ("total_usd", "lost_hours"):
                g[k] += r[k]
            if r["ondemand_usd"] is not None:
                g["ondemand_usd"] += r["ondemand_usd"]
                g["known_usd"] += r["total_usd"]
        out["by"] = by
        out["groups"] = [{**{k: v for k, v in g.items() if k != "known_usd"},
                          **{k: round(g[k], DECIMALS) for k in ("total_usd", "ondemand_usd", "lost_hours")},
                          "savings_usd": savings(g["known_usd"], g["ondemand_usd"])["savings_usd"]}
                         for _, g in sorted(groups.items())]
    return out


def fmt(value) -> str:
    """Amounts as every format prints them."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{DECIMALS}f}"
    return str(value)


def fmt_image(value) -> str:
    """$ per image: a fraction of a cent, with the six decimals job_terms rounds it to."""
    from .job_terms import IMAGE_DECIMALS

    return "" if value is None else f"{value:.{IMAGE_DECIMALS}f}"


CSV_COLUMNS = ["level", "run", "name", "tier", "provider", "attempt", "region", "zone", "instance_type", "market", "hours",
               "end_reason", *[f"{i}_usd" for i in ITEMS], "compute_source", "lost_hours", "cost_usd", "ondemand_usd",
               "billed_usd", "total_usd", "savings_usd", "savings_pct", "cost_per_1k_steps", "images_done", "cost_per_image",
               "cost_per_1k_images",
               "reclaims", "cause", "lost_minutes", "lost_usd"]


def to_csv(report: dict) -> str:
    """One row per attempt, one per run (level=run), one for the whole report (level=total)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    w.writeheader()
    for r in report["runs"]:
        base = {"run": r["run"], "name": r["name"] or "", "tier": r["tier"], "provider": r["provider"]}
        for a in r["attempts"]:
            w.writerow({**base, "level": "attempt", "attempt": a["n"], "region": a["region"], "zone": a["zone"],
                        "instance_type": a["instance_type"], "market": a["market"], "hours": fmt(a["hours"]),
                        "end_reason": a["end_reason"] or "running",
                        **{f"{i}_usd": fmt(a["items"][i]["usd"]) for i in ITEMS if i in a["items"]},
                        "compute_source": a["items"]["compute"]["source"],
                        "lost_hours": fmt(a["overhead"]["lost_hours"]) if a["overhead"] else fmt(0.0),
                        "cost_usd": fmt(a["cost_usd"]),
                        "ondemand_usd": fmt(a["ondemand_usd"]) if r["ondemand_usd"] is not None else ""})
        w.writerow({**base, "level": "run", "hours": fmt(r["hours"]), "lost_hours": fmt(r["lost_hours"]),
                    "cost_usd": fmt(r["estimate_usd"]), "ondemand_usd": fmt(r["ondemand_usd"]),
                    "billed_usd": fmt(r["billed_usd"]),
                    "total_usd": fmt(r["total_usd"]), "savings_usd": fmt(r["savings_usd"]), "savings_pct": fmt(r["savings_pct"]),
                    "cost_per_1k_steps": fmt(r["cost_per_1k_steps"]), "images_done": r.get("images_done", ""),
                    "cost_per_image": fmt_image(r["cost_per_image"]), "cost_per_1k_images": fmt(r.get("cost_per_1k_images")),
                    "reclaims": r["reclaims"]})
    t = report["totals"]
    w.writerow({"level": "total", "hours": fmt(t["hours"]), "lost_hours": fmt(t["lost_hours"]),
                "cost_usd": fmt(t["estimate_usd"]),
                "ondemand_usd": fmt(t["ondemand_usd"]), "total_usd": fmt(t["total_usd"]), "savings_usd": fmt(t["savings_usd"]),
                "savings_pct": fmt(t["savings_pct"]), "reclaims": t["reclaims"]})
    from .losses import csv_rows

    for row in csv_rows(report):  # level "loss" / "loss-total": minutes lost per cause
        w.writerow(row)
    return buf.getvalue()


# Columns of a run's table that give way at a narrow terminal, lesser first: the item breakdown
# (its sum is "cost $"), then the detail of each attempt. Zone, type, market, cost and the
# on-demand counterfactual stay longest.
RUN_COLUMNS = ("#", "provider", "zone", "type", "market", "hours", "ended by", *[f"{i} $" for i in ITEMS], "source",
               "lost h", "cost $", "on-demand $")
RUN_DROP = ("provider", "requests $", "bucket $", "disk $", "source", "compute $", "lost h", "hours", "#", "ended by")


def print_tables(report: dict) -> None:
    """The report as rich tables on stdout: one per run, then the period's totals. Lines wrap at
    word boundaries; columns left out to fit are named once, under the last table."""
    from ..render import echo, hidden_note, table

    hidden: list[str] = []

    def note_hidden(names: list[str]) -> None:
        hidden.extend(n for n in names if n not in hidden)

    for r in report["runs"]:
        batch = RunKind.of(r) is RunKind.BATCH
        title = (f"{'job' if batch else 'run'} {r['run']}" + (f" ({r['name']})" if r["name"] else "")
                 + f": {r['tier']}, {r['state']}")
        od_known = r["ondemand_usd"] is not None
        rows = [(a["n"], a["provider"], a["zone"], a["instance_type"], a["market"], fmt(a["hours"]), a["end_reason"] or "running",
                 *[fmt(a["items"][i]["usd"]) if i in a["items"] else "" for i in ITEMS], a["items"]["compute"]["source"],
                 fmt(a["overhead"]["lost_hours"]) if a["overhead"] else fmt(0.0), fmt(a["cost_usd"]),
                 fmt(a["ondemand_usd"]) if od_known else "unknown")
                for a in r["attempts"]]
        if rows:
            note_hidden(table(title, RUN_COLUMNS, rows, drop=RUN_DROP, note_hidden=False))
        else:  # a run or job that has not started a host: no empty table
            echo(f"{title}: no {'host' if batch else 'attempt'} yet")
        echo(_run_line(r))
        from .groups import line as nodes_line

        if r.get("nodes"):  # a multi-node run: each node's hours and cost, the group's totals
            echo(nodes_line(r["nodes"]))
        from .cloud_moves import lines as move_lines

        for line in move_lines(r):  # a run that moved between clouds: egress and transfer, each its line
            echo(line)
        from .losses import line as losses_line

        if losses_line(r.get("losses")):
            echo(losses_line(r.get("losses")))
    if report.get("groups"):
        note_hidden(table(f"by {report['by']}", [report["by"], "runs", "total $", "on-demand $", "saved $", "lost h"],
                          [(g["key"], g["runs"], fmt(g["total_usd"]), fmt(g["ondemand_usd"]), fmt(g["savings_usd"]),
                            fmt(g["lost_hours"])) for g in report["groups"]],
                          drop=["lost h", "runs", "on-demand $"], note_hidden=False))
    t = report["totals"]
    if not t["runs"]:
        echo("no runs or batch jobs to report: nothing was spent (see: sdcloud status)")
        return
    over = ("" if t.get("savings_over_runs", t["runs"]) == t["runs"]
            else f" (over the {t['savings_over_runs']} runs whose on-demand price is known)")
    kinds = {"job" if RunKind.of(r) is RunKind.BATCH else "run" for r in report["runs"]}
    noun = "job" if kinds == {"job"} else "run"
    many = {"job": "jobs", "run": "runs"}[noun] if len(kinds) == 1 else "runs and jobs"
    echo((f"the one {noun}" if t["runs"] == 1 else f"all {t['runs']} {many}")
         + f": total ${fmt(t['total_usd'])}; on-demand ${fmt(t['ondemand_usd'])}; "
         f"saved ${fmt(t['savings_usd'])}{over}; reclaims {t['reclaims']}, lost {fmt(t['lost_hours'])} h")
    for cur, rate in report["rates"].items():
        echo(f"{cur} converted at {rate['usd_per_unit']} USD per {cur}")
    if hidden:
        echo(hidden_note(hidden))


def _run_line(r: dict) -> str:
    """A run's (or batch job's) totals under its table: what it cost, what on-demand would have,
    the savings, and the cost per unit of its work (1k steps, or an image and 1k images)."""
    # A billed total beside the estimate it replaces; an estimated total once ("(estimate); estimate" was doubled).
    total = f"total ${fmt(r['total_usd'])} ({r['total_source']})"
    if r["total_source"] != "estimate":
        total += f"; estimate ${fmt(r['estimate_usd'])}"
    if r["ondemand_usd"] is None:
        line = f"{total}; on-demand unknown (no on-demand price was recorded for its hosts), so no savings claimed"
    else:
        line = f"{total}; on-demand ${fmt(r['ondemand_usd'])}; saved ${fmt(r['savings_usd'])}"
        if r["savings_pct"] is not None:
            line += f" ({r['savings_pct']:.1f}%)"
    line += f"; reclaims {r['reclaims']}, lost {fmt(r['lost_hours'])} h"
    if RunKind.of(r) is RunKind.BATCH:
        line += f"; {r['images_done']}/{r['images']} images"
        if r["cost_per_image"] is not None:
            line += f", ${fmt_image(r['cost_per_image'])} per image, ${fmt(r['cost_per_1k_images'])} per 1k images"
    else:
        if r["cost_per_1k_steps"] is not None:
            line += f"; ${fmt(r['cost_per_1k_steps'])} per 1k steps"
        if r["cost_per_image"] is not None:
            line += f"; ${fmt_image(r['cost_per_image'])} per image"
    if r["billed_usd"] is not None:
        line += f"; billed ${fmt(r['billed_usd'])}"
    driver = r.get("run_items", {}).get("driver")
    if driver:  # the cloud driver's invocations for this run (sdcloud/costs/driver.py)
        calls = sum(d["invocations"] for d in driver["detail"]["drivers"].values())
        line += f"; cloud driver {calls} invocations ${fmt(driver['usd'])}"
        if driver["detail"]["unpriced"]:
            line += " (" + ", ".join(driver["detail"]["unpriced"]) + " unpriced)"
    return line

