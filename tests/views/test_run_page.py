"""`sdcloud report RUN`: the run page's JSON carries what the page shows, the HTML needs nothing but
itself, the charts hold one marker per metrics row, and the cost is `cost report`'s."""

from __future__ import annotations

import base64
import json
import re

from sdcloud.cli import main
from tests.views.conftest import CHECKPOINTS, PROMPTS, STEPS


def report(capsys, *args: str) -> str:
    capsys.readouterr()
    assert main(["report", *args]) == 0
    return capsys.readouterr().out


def markers(figure: str) -> int:
    """Points drawn: the `<use>` elements of the points' group (ticks and glyphs are `<use>` too)."""
    import xml.etree.ElementTree as ET

    svg = ET.fromstring(figure[figure.index("<svg"):figure.rindex("</svg>") + 6])
    group = next((g for g in svg.iter("{http://www.w3.org/2000/svg}g") if g.get("id", "").startswith("points-")), None)
    return 0 if group is None else sum(1 for _ in group.iter("{http://www.w3.org/2000/svg}use"))


def figures(text: str) -> dict[str, str]:
    """Each chart's figure element, by its data-chart id."""
    return dict(re.findall(r'<figure data-chart="([a-z_]+)".*?>(.*?)</figure>', text, re.S))


def test_json_has_the_samples_the_loss_points_and_the_reclaim(trained_run, capsys):
    state, run_id, store = trained_run
    page = json.loads(report(capsys, run_id, "--format", "json"))
    samples = page["samples"]
    assert len(samples) == len(PROMPTS) * len(CHECKPOINTS)
    assert {(s["step"], s["prompt"]) for s in samples} == {(c, p) for c in CHECKPOINTS for p in PROMPTS}
    for s in samples:
        assert s["src"].startswith("data:image/png;base64,")
        data = base64.b64decode(s["src"].split(",", 1)[1])
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data == store.get(s["key"])
    # One point a step: the resumed attempt's records win for the steps it trained again.
    assert [m["step"] for m in page["metrics"]] == list(range(1, STEPS + 1))
    assert all(m["loss"] is not None for m in page["metrics"])
    assert {m["attempt"] for m in page["metrics"] if m["step"] > 15} == {2}
    assert [e["kind"] for e in page["events"] if e["group"] == "reclaim"] == ["reclaimed"]
    assert [(a["n"], a["cause"]) for a in page["attempts"]] == [(1, "preempted"), (2, "succeeded")]
    h = page["header"]
    assert (h["tier"], h["model"], h["state"], h["step"], h["total_steps"]) == ("sd15-lora", "tiny", "succeeded", 30, 30)
    assert h["time_left_s"] == 0.0


def test_cost_on_the_page_is_the_cost_reports(trained_run, capsys):
    _, run_id, _ = trained_run
    rep = json.loads(report(capsys, run_id, "--format", "json"))
    capsys.readouterr()
    assert main(["cost", "report", run_id, "--format", "json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    assert rep["header"]["cost_usd"] == cost["runs"][0]["total_usd"] > 0
    assert rep["cost"]["totals"]["total_usd"] == cost["totals"]["total_usd"]
    text = report(capsys, run_id)
    shown = re.search(r'data-total="total_usd">([^<]+)<', text).group(1)
    assert float(shown) == cost["totals"]["total_usd"]


def test_html_needs_nothing_but_itself(trained_run, capsys):
    _, run_id, _ = trained_run
    text = report(capsys, run_id)
    assert text.startswith("<!doctype html>")
    # No address outside the page: no CDN script, stylesheet, font or image.
    assert not re.search(r'(src|href)="(https?:)?//', text)
    assert "<link" not in text and "@import" not in text and "url(http" not in text
    imgs = re.findall(r'<img class="sample"[^>]*src="([^"]+)"', text)
    assert len(imgs) == len(PROMPTS) * len(CHECKPOINTS)
    assert all(src.startswith("data:image/png;base64,") for src in imgs)


def test_every_chart_has_one_marker_per_metrics_row(trained_run, capsys):
    _, run_id, _ = trained_run
    page = json.loads(report(capsys, run_id, "--format", "json"))
    text = report(capsys, run_id)
    figs = figures(text)
    assert set(figs) == {"loss", "steps_per_s", "gpu_util", "mem_used", "temp", "cost_usd"}
    rows = page["metrics"]
    assert markers(figs["loss"]) == len(rows) == STEPS
    assert markers(figs["steps_per_s"]) == sum(1 for m in rows if m["steps_per_s"] is not None)
    assert markers(figs["cost_usd"]) == len(rows)
    # No GPU on this host: no GPU points, and the chart says so.
    assert markers(figs["gpu_util"]) == 0


def test_output_file_and_refusals(trained_run, capsys, tmp_path):
    _, run_id, _ = trained_run
    out = tmp_path / "page.html"
    assert main(["report", run_id, "-o", str(out)]) == 0
    assert out.read_text().count('class="sample"') == len(PROMPTS) * len(CHECKPOINTS)
    capsys.readouterr()
    for args, needle in ((["r-nosuch"], "no run 'r-nosuch'"), ([run_id, "--format", "pdf"], "--format must be one of"),
                         ([run_id, "-o", str(tmp_path / "no" / "x.html")], "does not exist")):
        assert main(["report", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "no").exists()


def test_a_run_without_samples_or_metrics_yet_still_has_a_page(sdcloud_home, capsys):
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    state.create_run("r-fresh001", "sd15-lora", {"tier": "sd15-lora", "provider": "local", "model": "tiny"}, 40)
    page = json.loads(report(capsys, "r-fresh001", "--format", "json"))
    assert page["samples"] == [] and page["metrics"] == [] and page["header"]["state"] == "pending"
    text = report(capsys, "r-fresh001")
    assert "No samples yet" in text and "<!-- no points yet -->" in text
    assert all(markers(f) == 0 for f in figures(text).values())
