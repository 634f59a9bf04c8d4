"""Minutes lost per cause, and what each cost at the run's price: the trouble a run had, priced so
that a user can weigh a bigger or faster instance against it (`sdcloud cost report`).

Causes, each from what the run recorded (docs/costs.md has the arithmetic):
  data_wait     the seconds the trainer's steps waited for data, as the host totalled them over
                each attempt (its health events, runs/driving/health_view.py, carry the total so far)
  throttling    between two health events of an attempt, the time multiplied by the clock lost to
                a slowdown (1 - SM clock / its max), while a slowdown reason was active
  saves         the seconds checkpoint saves took, as the host totalled them over each attempt
                (a run recorded by a host that kept no totals: the time between two events times
                the share of each step spent waiting, or of the wall time spent in saves)
  oom_restarts  each out-of-memory retry's cost as the host measured it (its trainer's start-up and
                the steps done again), else from the retry to the first progress back at its step
  reclaims      the ledger's time lost to reclaims (boot of the next host, steps done again)
  boots         launch to first step of every attempt that did not follow a reclaim (those are in
                reclaims)
  sampling      the seconds the trainer spent rendering the run's sample images (`up --sample-prompt`),
                as the host totalled them: asked for, not lost, but not training either
Each minute is priced at its attempt's own rate (its cost over its hours, every item included).
Health figures are measured on the host, so a cause the host did not measure counts nothing.
"""

from __future__ import annotations

from typing import Any

from ..events import Kind
from .ledger import DECIMALS

CAUSES = ("data_wait", "throttling", "saves", "oom_restarts", "reclaims", "boots", "sampling")
WORDS = {"data_wait": "data wait", "throttling": "throttling", "saves": "saves", "oom_restarts": "OOM restarts",
         "reclaims": "reclaims", "boots": "boots", "sampling": "sampling"}
# The seconds the host itself totalled over an attempt (sdcloud_agent/health.py Monitor), each
# cause's event field; a run recorded by a host that did not total them is charged its share.
MEASURED = {"data_wait": "data_wait_seconds", "saves": "save_seconds", "sampling": "sample_seconds"}
SHARES = {"data_wait": "data_wait_pct", "saves": "save_pct"}
# A gap between two health events longer than this was not training (the host was gone, or
# restarting): only this much of it is charged to the earlier event's figures.
MAX_GAP_S = 180.0


def _rate(row: dict) -> float:
    """The attempt's USD per hour, everything included."""
    return row["cost_usd"] / row["hours"] if row.get("hours") else 0.0


def run_losses(state: Any, cost: dict, now: float) -> dict:
    """{"minutes": {cause: m}, "usd": {cause: $}, "total_minutes", "total_usd"} of one run,
    `cost` being its ledger.run_cost() dict."""
    rows = {a["n"]: a for a in cost["attempts"]}
    seconds = dict.fromkeys(CAUSES, 0.0)
    usd = dict.fromkeys(CAUSES, 0.0)

    def charge(cause: str, n: int | None, secs: float) -> None:
        if secs <= 0:
            return
        seconds[cause] += secs
        usd[cause] += secs / 3600.0 * _rate(rows.get(n) or {})

    health: dict[int, list[tuple[float, dict]]] = {}
    measured: dict[tuple[int, str], float] = {}  # (attempt, cause): the host's own total, newest event's
    progress: dict[int, list[tuple[float, int]]] = {}
    ooms: list[tuple[float, dict]] = []
    for ev in state.events(cost["run"]):
        kind, data, ts = ev["kind"], ev["data"] or {}, float(ev["time"])
        n = data.get("attempt")
        if kind is Kind.HEALTH and isinstance(n, int):
            for cause, key in MEASURED.items():
                if data.get(key) is not None:
                    measured[(n, cause)] = max(measured.get((n, cause), 0.0), float(data[key]))
            if data.get("verdict"):
                health.setdefault(n, []).append((ts, data))
        elif kind is Kind.PROGRESS and isinstance(n, int) and data.get("step") is not None:
            progress.setdefault(n, []).append((ts, int(data["step"])))
        elif kind is Kind.OOM_RETRY:
            ooms.append((ts, data))
    for n, evs in health.items():
        row = rows.get(n) or {}
        end = row.get("end") or now
        for i, (ts, h) in enumerate(evs):
            dt = min((evs[i + 1][0] if i + 1 < len(evs) else end) - ts, MAX_GAP_S)
            if dt <= 0:
                continue
            for cause, key in SHARES.items():
                if (n, cause) not in measured:  # a host that did not total it: its share of the time
                    charge(cause, n, dt * (h.get(key) or 0.0) / 100.0)
            if (h.get("throttle_pct") or 0) > 0 and h.get("sm_clock_pct") is not None:
                charge("throttling", n, dt * max(0.0, 1.0 - h["sm_clock_pct"] / 100.0))
    for (n, cause), secs in measured.items():
        charge(cause, n, secs)
    for ts, data in ooms:
        n = data.get("attempt")
        if data.get("lost_s") is not None:  # measured on the host: a start-up and the steps redone
            charge("oom_restarts", n, float(data["lost_s"]))
            continue
        seen = progress.get(n, [])
        before = [s for t, s in seen if t <= ts]
        reached = max(before) if before else data.get("resume_step")
        back = next((t for t, s in seen if t > ts and reached is not None and s >= reached), None)
        if back is not None:
            charge("oom_restarts", n, back - ts)
    for a in cost["attempts"]:
        oh = a.get("overhead")
        if oh:
            charge("reclaims", a["n"], oh["lost_hours"] * 3600.0)
    costs = state.attempt_costs(cost["run"])
    for a in cost["attempts"]:
        if a.get("overhead"):
            continue  # its boot is the reclaim's
        first = (costs.get(a["n"]) or {}).get("first_step_at")
        if first is not None and a.get("start") is not None:
            charge("boots", a["n"], first - a["start"])
    minutes = {c: round(seconds[c] / 60.0, 2) for c in CAUSES}
    money = {c: round(usd[c], DECIMALS) for c in CAUSES}
    return {"minutes": minutes, "usd": money, "total_minutes": round(sum(seconds.values()) / 60.0, 2),
            "total_usd": round(sum(usd.values()), DECIMALS)}


def add_losses(state: Any, per_run: list[dict], totals: dict, now: float) -> None:
    """Each run's `losses` and the report's total (build_report's hook)."""
    for r in per_run:
        r["losses"] = run_losses(state, r, now)
    totals["losses"] = {
        "minutes": {c: round(sum(r["losses"]["minutes"][c] for r in per_run), 2) for c in CAUSES},
        "usd": {c: round(sum(r["losses"]["usd"][c] for r in per_run), DECIMALS) for c in CAUSES},
        "total_minutes": round(sum(r["losses"]["total_minutes"] for r in per_run), 2),
        "total_usd": round(sum(r["losses"]["total_usd"] for r in per_run), DECIMALS)}


def line(losses: dict | None) -> str | None:
    """`minutes lost: data wait 12.50 ($0.0831), saves 3.00 ($0.0200)`; None when nothing was lost."""
    if not losses or not any(losses["minutes"].values()):
        return None
    bits = [f"{WORDS[c]} {losses['minutes'][c]:.2f} (${losses['usd'][c]:.{DECIMALS}f})" for c in CAUSES
            if losses["minutes"][c]]
    return f"minutes lost: {', '.join(bits)}; in all {losses['total_minutes']:.2f} min, ${losses['total_usd']:.{DECIMALS}f}"


def csv_rows(report: dict) -> list[dict]:
    """Rows of level "loss": one per run and cause that lost time, one per cause for the total."""
    out = []
    for r in report["runs"]:
        for c in CAUSES:
            if r.get("losses") and r["losses"]["minutes"][c]:
                out.append({"level": "loss", "run": r["run"], "name": r["name"] or "", "tier": r["tier"],
                            "provider": r["provider"], "cause": c, "lost_minutes": f"{r['losses']['minutes'][c]:.2f}",
                            "lost_usd": f"{r['losses']['usd'][c]:.{DECIMALS}f}"})
    tot = report["totals"].get("losses")
    for c in CAUSES:
        if tot and tot["minutes"][c]:
            out.append({"level": "loss-total", "cause": c, "lost_minutes": f"{tot['minutes'][c]:.2f}",
                        "lost_usd": f"{tot['usd'][c]:.{DECIMALS}f}"})
    return out


def html_table(report: dict) -> str:
    """The report's minutes lost per cause (runs that lost any), or "" when none did."""
    import html

    runs = [r for r in report["runs"] if r.get("losses") and any(r["losses"]["minutes"].values())]
    if not runs:
        return ""
    head = "".join(f"<th>{WORDS[c]} min</th><th>{WORDS[c]} $</th>" for c in CAUSES)
    parts = [f'<h2>Minutes lost, per cause</h2><table><tr><th class="l">run</th>{head}<th>all min</th><th>all $</th></tr>']
    for r in runs:
        loss = r["losses"]
        cells = "".join(f'<td data-loss="{c}-minutes">{loss["minutes"][c]:.2f}</td>'
                        f'<td data-loss="{c}-usd">{loss["usd"][c]:.{DECIMALS}f}</td>' for c in CAUSES)
        parts.append(f'<tr data-run="{html.escape(r["run"])}"><td class="l">{html.escape(r["name"] or r["run"])}</td>'
                     f'{cells}<td>{loss["total_minutes"]:.2f}</td><td>{loss["total_usd"]:.{DECIMALS}f}</td></tr>')
    parts.append("</table>")
    return "".join(parts)
