"""The run page as one self-contained HTML file: header, sample grid, charts, attempts, cost table.

Nothing is fetched when the file is opened: images are data: URIs, charts inline SVG (charts.py),
the one small script (click a sample to enlarge it; on the dashboard, the live refresh) inline.
Each part is a section with an id, so the dashboard can replace one part without reloading the page.
"""

from __future__ import annotations

import html
from urllib.parse import quote
from datetime import datetime, timezone

from ..costs.html import _CSS as COST_CSS
from ..costs.html import tables_html
from ..costs.report import fmt
from .charts import EVENT_STYLE, SERIES, series_chart

CSS = COST_CSS + """
.grid td{vertical-align:top;text-align:center}.grid img.sample{width:128px;height:auto;cursor:zoom-in;display:block}
.grid th{font-weight:600}.prompt{max-width:16rem;text-align:left}.muted{color:#66707d;font-size:.85rem}
.gallery{display:flex;flex-wrap:wrap;gap:.5rem}.gallery figure{width:140px}.gallery figcaption{font-weight:400;font-size:.75rem}
dialog{padding:.5rem;border:1px solid #889}dialog img{max-width:90vw;max-height:85vh;image-rendering:pixelated;min-width:256px}
.legend span{margin-right:1rem}.state{font-weight:700}
"""

# Click a sample to enlarge it: one <dialog>, delegated so replaced sections keep working.
ENLARGE_JS = """document.addEventListener('click',function(e){var t=e.target;
if(!t.classList||!t.classList.contains('sample'))return;var d=document.getElementById('big');
d.querySelector('img').src=t.dataset.full||t.src;d.querySelector('p').textContent=t.alt;d.showModal();});
document.addEventListener('click',function(e){
if(e.target.id==='big'||e.target.closest('#big img'))document.getElementById('big').close();});"""

# The dashboard's refresh: ask for the sections when the page's version moved, replace them in place.
LIVE_JS = """(function(){var b=document.body,u=b.dataset.live;if(!u)return;var n=0;
function tick(){fetch(u+(u.indexOf('?')<0?'?':'&')+'since='+encodeURIComponent(b.dataset.version),{cache:'no-store'})
.then(function(r){return r.ok?r.json():null}).then(function(j){if(j&&j.sections){for(var id in j.sections){
var el=document.getElementById(id);if(el)el.innerHTML=j.sections[id];}
b.dataset.version=j.version;b.dataset.updates=String(++n);}})
.catch(function(){}).then(function(){setTimeout(tick,INTERVAL)});}setTimeout(tick,INTERVAL);})();"""

e = html.escape


def _minutes(page: dict, t: float) -> float:
    return (t - page["started"]) / 60.0


def _when(t: float | None) -> str:
    return "" if t is None else f"{datetime.fromtimestamp(t, timezone.utc):%Y-%m-%d %H:%M:%S} UTC"


def _left(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def header_html(page: dict) -> str:
    h = page["header"]
    title = h["name"] or page["run"]
    cards = [("state", h["state"], "state"), ("images" if page.get("batch") is not None else "step",
                                               f"{h['step'] or 0} / {h['total_steps'] or '?'}", "step"),
             ("cost $", fmt(h["cost_usd"]), "cost_usd"), ("time left", _left(h["time_left_s"]), "time_left")]
    if page.get("batch"):
        b = page["batch"]
        cards += [("images/s", fmt(b.get("images_per_s")), "images_per_s"), ("workers", str(b.get("workers")), "workers"),
                  ("$ / image", fmt(h.get("cost_per_image_usd")), "cost_per_image")]
    parts = [f"<h1>{e(str(title))}</h1><p>run {e(page['run'])} · tier {e(str(h['tier']))} · model "
             f"{e(str(h['model'] or '-'))} · dataset {e(str(h['dataset'] or 'builtin sample'))} · trainer "
             f"{e(str(h['trainer'] or '-'))} · on {e(str(h['provider']))}</p>", '<div class="cards">']
    for label, value, field in cards:
        # data-total: the same marks the cost report's browser test reads (costs/html.py).
        attr = ' data-total="total_usd"' if field == "cost_usd" else ""
        parts.append(f'<div class="card">{e(label)}<b data-field="{field}"{attr}>{e(str(value))}</b></div>')
    parts.append("</div>")
    if h.get("reason"):
        parts.append(f"<p>{e(h['reason'])}</p>")
    for note in page["notes"]:
        parts.append(f'<p class="muted">{e(note)}</p>')
    parts.append(f'<p class="muted">as of {_when(page["generated"])}</p>')
    return "".join(parts)


def samples_html(page: dict) -> str:
    if page.get("batch") is not None:
        return _gallery_html(page["batch"])
    samples = page["samples"]
    if not samples:
        return "<h2>Samples</h2><p class=\"muted\">No samples yet: they come with each checkpoint (up --sample-prompt).</p>"
    steps = sorted({s["step"] for s in samples})
    prompts: dict[int, str] = {}
    for s in samples:
        prompts.setdefault(s["index"], s.get("prompt") or "")
    cell = {(s["index"], s["step"]): s for s in samples}
    parts = [f"<h2>Samples</h2><p class=\"muted\">{len(samples)} images, prompts × checkpoints; click one to enlarge.</p>",
             '<table class="grid"><tr><th class="l">prompt</th>' + "".join(f"<th>step {st}</th>" for st in steps) + "</tr>"]
    for idx in sorted(prompts):
        parts.append(f'<tr><td class="prompt">{e(prompts[idx])}</td>')
        for st in steps:
            s = cell.get((idx, st))
            if s is None:
                parts.append("<td></td>")
                continue
            alt = f"step {st} · {s.get('prompt') or ''} · seed {s.get('seed')}"
            # On the dashboard, a click shows the image at full size; the file has the thumbnail only.
            full = f' data-full="{e(page["image_base"])}?key={quote(s["key"], safe="")}"' if page.get("image_base") else ""
            parts.append(f'<td><img class="sample" data-step="{st}" data-index="{idx}" alt="{e(alt)}"{full} src="{s["src"]}">'
                         f'<span class="muted">seed {e(str(s.get("seed")))}</span></td>')
        parts.append("</tr>")
    parts.append("</table>")
    return "".join(parts)


def _gallery_html(batch: dict) -> str:
    shown = batch.get("gallery") or []
    more = batch.get("gallery_total", 0) - len(shown)
    parts = [f"<h2>Gallery</h2><p class=\"muted\">{batch.get('images_done', 0)} of {batch.get('images')} images made"
             + (f"; the newest {len(shown)} shown (sdcloud batch pull has all)" if more > 0 else "") + ".</p>",
             '<div class="gallery">']
    for g in shown:
        alt = f"{g.get('prompt') or ''} · seed {g.get('seed')}"
        parts.append(f'<figure><img class="sample" alt="{e(alt)}" data-key="{e(g["key"])}" src="{g["src"]}" '
                     f'style="width:140px;cursor:zoom-in"><figcaption>{e(str(g.get("prompt") or ""))}'
                     f' · seed {e(str(g.get("seed")))}</figcaption></figure>')
    parts.append("</div>")
    return "".join(parts)


def charts_html(page: dict) -> str:
    events = [{"minutes": _minutes(page, ev["t"]), "group": ev["group"]} for ev in page["events"]]
    rows = page["metrics"]
    ends = [r["t"] for r in rows] + [ev["t"] for ev in page["events"]] + [a["end"] or page["generated"] for a in page["attempts"]]
    span = max((_minutes(page, t) for t in ends), default=0.0) or None
    parts = ["<h2>Charts</h2>", '<p class="legend muted">']
    for group, (colour, _) in EVENT_STYLE.items():
        n = sum(1 for ev in events if ev["group"] == group)
        parts.append(f'<span style="color:{colour}">┆ {group} ({n})</span>')
    parts.append('</p><div class="charts">')
    for chart_id, caption, field, ylabel in SERIES:
        points = [(_minutes(page, r["t"]), float(r[field])) for r in rows if r.get(field) is not None]
        smooth = None
        if field == "loss":
            smooth = [(_minutes(page, r["t"]), float(r["loss_smooth"])) for r in rows if r.get("loss_smooth") is not None]
        if field == "cost_usd" and not points:
            points = _cost_points(page)
        parts.append(f'<figure data-chart="{chart_id}" data-points="{len(points)}"><figcaption>{e(caption)}</figcaption>'
                     f"{series_chart(points, events, ylabel, smooth, gid=f'points-{chart_id}', span=span)}</figure>")
    parts.append("</div>")
    if page["events"]:
        parts.append("<h2>Events</h2><table><tr><th>minute</th><th class=\"l\">event</th></tr>")
        for ev in page["events"]:
            parts.append(f'<tr data-event="{e(ev["group"])}"><td>{_minutes(page, ev["t"]):.1f}</td>'
                         f'<td class="l">{e(ev["words"])}</td></tr>')
        parts.append("</table>")
    return "".join(parts)


def _cost_points(page: dict) -> list[tuple[float, float]]:
    """Cost so far when the metrics stream carries none: each attempt's start and end, cumulative."""
    pts: list[tuple[float, float]] = []
    cum = 0.0
    for a in page["attempts"]:
        end = a["end"] if a["end"] is not None else page["generated"]
        pts.append((_minutes(page, a["start"]), cum))
        cum += a["cost_usd"] or 0.0
        pts.append((_minutes(page, end), cum))
    return pts


def attempts_html(page: dict) -> str:
    parts = ["<h2>Attempts</h2><table><tr><th>#</th><th class=\"l\">zone</th><th class=\"l\">type</th>"
             "<th class=\"l\">market</th><th class=\"l\">started</th><th>hours</th><th>cost $</th>"
             "<th class=\"l\">ended by</th></tr>"]
    for a in page["attempts"]:
        parts.append(f'<tr data-attempt="{a["n"]}"><td>{a["n"]}</td><td class="l">{e(str(a["zone"]))}</td>'
                     f'<td class="l">{e(str(a["instance_type"]))}</td><td class="l">{e(str(a["market"]))}</td>'
                     f'<td class="l">{_when(a["start"])}</td><td>{fmt(a["hours"])}</td><td>{fmt(a["cost_usd"])}</td>'
                     f'<td class="l">{e(a["cause"])}</td></tr>')
    parts.append("</table>")
    return "".join(parts)


def cost_html(page: dict) -> str:
    return "<h2>Cost</h2>" + tables_html(page["cost"])


SECTIONS = {"header": header_html, "samples": samples_html, "charts": charts_html, "attempts": attempts_html,
            "cost": cost_html}


def sections(page: dict) -> dict[str, str]:
    return {sid: fn(page) for sid, fn in SECTIONS.items()}


def render(page: dict, live_url: str | None = None, version: str = "", interval_ms: int = 1500,
           back: str | None = None) -> str:
    """The whole page; with live_url (the dashboard), the script that refreshes its sections."""
    title = page["header"]["name"] or page["run"]
    body_attrs = f' data-version="{e(version)}"' + (f' data-live="{e(live_url)}"' if live_url else "")
    parts = [f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>sdcloud · {e(str(title))}</title>',
             f"<style>{CSS}</style></head><body{body_attrs}>"]
    if back:
        parts.append(f'<p><a href="{e(back)}">← all jobs</a></p>')
    for sid, inner in sections(page).items():
        parts.append(f'<section id="{sid}">{inner}</section>')
    parts.append('<dialog id="big"><img alt="sample"><p class="muted"></p></dialog>')
    parts.append(f"<script>{ENLARGE_JS}</script>")
    if live_url:
        parts.append(f"<script>{LIVE_JS.replace('INTERVAL', str(int(interval_ms)))}</script>")
    parts.append("</body></html>\n")
    return "".join(parts)
