"""The cost report as one self-contained HTML file: tables and matplotlib charts inlined as SVG.

Nothing is fetched when the file is opened (no scripts, fonts or images from elsewhere), so it
works offline and can be mailed. Text in the charts is drawn as paths, so no font is needed.
"""

from __future__ import annotations

import html
import io
from datetime import datetime, timedelta, timezone

from .report import ITEMS, fmt, fmt_image

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem;color:#1d2430;background:#fff}
h1{font-size:1.6rem}h2{font-size:1.2rem;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0 1rem}td,th{border:1px solid #ccd;padding:.25rem .5rem;text-align:right}
th{background:#eef1f6}td.l,th.l{text-align:left}
.cards{display:flex;gap:1rem;flex-wrap:wrap}.card{border:1px solid #ccd;border-radius:8px;padding:.75rem 1rem;min-width:10rem}
.card b{display:block;font-size:1.4rem}.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(480px,1fr));gap:1rem}
figure{margin:0}figcaption{font-weight:600;margin-bottom:.25rem}
"""


def _svg(fig) -> str:
    buf = io.StringIO()
    # No date or creator in the file: the same report renders to the same bytes.
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _charts(report: dict) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "path", "font.size": 9, "svg.hashsalt": "sdcloud"})
    runs = report["runs"]
    charts = []

    # 1. Cost over time, one line per attempt (cumulative within its run, hours since the run started).
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for r in runs:
        t0 = min((a["start"] for a in r["attempts"]), default=r["created"])
        cum = 0.0
        for a in r["attempts"]:
            end = a["end"] if a["end"] is not None else report["generated"]
            xs = [(a["start"] - t0) / 3600, (end - t0) / 3600]
            ax.plot(xs, [cum, cum + a["cost_usd"]], marker="o", label=f"{r['run']} #{a['n']} {a['market']}")
            cum += a["cost_usd"]
    ax.set_xlabel("hours since the run started")
    ax.set_ylabel("USD, cumulative")
    if any(r["attempts"] for r in runs):  # a legend of no lines is a warning, not a legend
        ax.legend(fontsize=7)
    charts.append(("Cost over time, per attempt", _svg(fig)))
    plt.close(fig)

    labels = [r["name"] or r["run"] for r in runs]
    x = list(range(len(runs)))
    # 2. Spot against the on-demand counterfactual.
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    ax.bar([i - 0.2 for i in x], [r["total_usd"] for r in runs], width=0.4, label="this run")
    ax.bar([i + 0.2 for i in x], [r["ondemand_usd"] or 0.0 for r in runs], width=0.4, label="on-demand, same work")
    ax.set_xticks(x, labels, rotation=20)
    ax.set_xlim(-0.8, max(len(runs), 2) - 0.2)
    ax.set_ylabel("USD")
    ax.legend(fontsize=7)
    charts.append(("Spot against the on-demand counterfactual", _svg(fig)))
    plt.close(fig)

    # 3. Time lost to reclaims (boot to first step plus redone steps), per run.
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    ax.bar(x, [r["lost_hours"] for r in runs], width=0.5, color="#d9534f")
    ax.set_xticks(x, labels, rotation=20)
    ax.set_xlim(-0.8, max(len(runs), 2) - 0.2)
    ax.set_ylabel("hours lost")
    charts.append(("Time lost to reclaims", _svg(fig)))
    plt.close(fig)

    # 4. Cost per run over the period.
    fig = _period_chart(plt, runs)
    charts.append(("Cost per run over the period", _svg(fig)))
    plt.close(fig)
    return charts


# A single run, or runs on one day, are shown with this much either side (hours): a day in all.
PERIOD_PAD_HOURS = 12.0


def _period_chart(plt, runs: list[dict]):
    """Cost of each run at the time it was created. The x-axis spans the runs' own period, padded by
    5 % (at least PERIOD_PAD_HOURS): matplotlib's default for one date is four years around it."""
    import matplotlib.dates as mdates

    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    order = sorted(runs, key=lambda r: r["created"])
    days = [datetime.fromtimestamp(r["created"], timezone.utc) for r in order]
    ax.plot(days, [r["total_usd"] for r in order], marker="o")
    ax.set_ylabel("USD per run")
    if days:
        pad = max((days[-1] - days[0]) * 0.05, timedelta(hours=PERIOD_PAD_HOURS))
        ax.set_xlim(days[0] - pad, days[-1] + pad)
        locator = mdates.AutoDateLocator(tz=timezone.utc, maxticks=8)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=timezone.utc))
    fig.autofmt_xdate()
    return fig


def _cell(value, field: str | None = None, left: bool = False) -> str:
    attrs = f' data-field="{field}"' if field else ""
    cls = ' class="l"' if left else ""
    return f"<td{cls}{attrs}>{html.escape(fmt(value))}</td>"


def render_html(report: dict) -> str:
    t = report["totals"]
    e = html.escape
    parts = ["<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>sdcloud cost report</title>",
             f"<style>{_CSS}</style></head><body>",
             "<h1>sdcloud cost report</h1>",
             f"<p>{t['runs']} runs, {t['attempts']} attempts, generated "
             f"{datetime.fromtimestamp(report['generated'], timezone.utc):%Y-%m-%d %H:%M} UTC; amounts in USD.</p>",
             '<div class="cards">']
    for field, label in (("total_usd", "total $"), ("ondemand_usd", "on-demand $"), ("savings_usd", "saved $"),
                         ("lost_hours", "hours lost to reclaims")):
        parts.append(f'<div class="card">{label}<b id="total-{field}" data-total="{field}">{fmt(t[field])}</b></div>')
    parts.append("</div>")
    for cur, rate in report["rates"].items():
        parts.append(f"<p>{e(cur)} converted at {rate['usd_per_unit']} USD per {e(cur)}.</p>")
    parts.append('<h2>Charts</h2><div class="charts">')
    for caption, svg in _charts(report):
        parts.append(f"<figure><figcaption>{e(caption)}</figcaption>{svg}</figure>")
    parts.append("</div>")
    parts.append(tables_html(report))
    parts.append("<p>Sources: price-history (the zone's own spot price history), samples (spot prices sampled at launch "
                 "and while running), list (the provider's list price), rule (a billing rule, e.g. no charge for an EC2 "
                 "spot interruption in the first hour), estimate (bucket, requests). Billed amounts, when reconciled, "
                 "replace the estimate in the total.</p></body></html>")
    return "".join(parts)


def tables_html(report: dict) -> str:
    """The report's tables (runs, attempts, losses, groups) as an HTML fragment: the cost report's
    and the run page's (views/html.py) cost table."""
    e = html.escape
    parts = ["<h2>Runs</h2><table><tr><th class=\"l\">run</th><th class=\"l\">tier</th><th class=\"l\">provider</th>"
             "<th>attempts</th><th>reclaims</th><th>lost h</th><th>estimate $</th><th>billed $</th><th>total $</th>"
             "<th>on-demand $</th><th>saved $</th><th>saved %</th><th>$ / 1k steps</th><th>$ / image</th>"
             "<th>$ / 1k images</th></tr>"]
    for r in report["runs"]:
        parts.append(f'<tr data-run="{e(r["run"])}">' + _cell(r["name"] or r["run"], left=True) + _cell(r["tier"], left=True)
                     + _cell(r["provider"], left=True) + _cell(len(r["attempts"])) + _cell(r["reclaims"], "reclaims")
                     + _cell(r["lost_hours"], "lost_hours") + _cell(r["estimate_usd"], "estimate_usd")
                     + _cell(r["billed_usd"], "billed_usd") + _cell(r["total_usd"], "total_usd")
                     + _cell(r["ondemand_usd"], "ondemand_usd") + _cell(r["savings_usd"], "savings_usd")
                     + _cell(r["savings_pct"], "savings_pct") + _cell(r["cost_per_1k_steps"], "cost_per_1k_steps")
                     + f'<td data-field="cost_per_image">{fmt_image(r["cost_per_image"])}</td>'
                     + _cell(r.get("cost_per_1k_images"), "cost_per_1k_images") + "</tr>")
    parts.append("</table><h2>Attempts</h2><table><tr><th class=\"l\">run</th><th>#</th><th class=\"l\">zone</th>"
                 "<th class=\"l\">type</th><th class=\"l\">market</th><th>hours</th><th class=\"l\">ended by</th>"
                 + "".join(f"<th>{i} $</th>" for i in ITEMS) + "<th class=\"l\">price source</th><th>lost h</th>"
                 "<th>cost $</th><th>on-demand $</th></tr>")
    for r in report["runs"]:
        for a in r["attempts"]:
            parts.append(f'<tr data-run="{e(r["run"])}" data-attempt="{a["n"]}">' + _cell(r["run"], left=True) + _cell(a["n"])
                         + _cell(a["zone"], left=True) + _cell(a["instance_type"], left=True) + _cell(a["market"], left=True)
                         + _cell(a["hours"], "hours") + _cell(a["end_reason"] or "running", left=True)
                         + "".join(_cell(a["items"][i]["usd"] if i in a["items"] else None, f"{i}_usd") for i in ITEMS)
                         + _cell(a["items"]["compute"]["source"], left=True)
                         + _cell(a["overhead"]["lost_hours"] if a["overhead"] else 0.0, "lost_hours")
                         + _cell(a["cost_usd"], "cost_usd") + _cell(a["ondemand_usd"], "ondemand_usd") + "</tr>")
    parts.append("</table>")
    from .losses import html_table

    parts.append(html_table(report))  # minutes lost per cause (costs/losses.py); "" when none
    if report.get("groups"):
        parts.append(f"<h2>By {e(report['by'])}</h2><table><tr><th class=\"l\">{e(report['by'])}</th><th>runs</th>"
                     "<th>total $</th><th>on-demand $</th><th>saved $</th><th>lost h</th></tr>")
        for g in report["groups"]:
            parts.append("<tr>" + _cell(g["key"], left=True) + _cell(g["runs"]) + _cell(g["total_usd"])
                         + _cell(g["ondemand_usd"]) + _cell(g["savings_usd"]) + _cell(g["lost_hours"]) + "</tr>")
        parts.append("</table>")
    return "".join(parts)
