"""The HTML cost report in a real browser: Debian chromium, headless. A screenshot must not be
blank, and the totals read from the rendered DOM must equal the JSON report's."""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from sdcloud.cli import main
from tests.costs.test_cost_report import cli_out, costed_run  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'chromium-profile'}"]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=180)


class Totals(HTMLParser):
    """Text of every element carrying data-total or data-field, as the browser rendered it."""

    def __init__(self):
        super().__init__()
        self.found: dict[str, str] = {}
        self.cells: list[tuple[str, str, str]] = []
        self._open: tuple[str, str] | None = None
        self._row: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr":
            self._row = a.get("data-run") if "data-attempt" not in a else None
        if "data-total" in a:
            self._open = ("total", a["data-total"])
        elif "data-field" in a and self._row:
            self._open = (self._row, a["data-field"])

    def handle_data(self, data):
        if self._open:
            kind, name = self._open
            if kind == "total":
                self.found[name] = data.strip()
            else:
                self.cells.append((kind, name, data.strip()))
            self._open = None


def test_html_report_renders_in_chromium_with_the_json_totals(costed_run, capsys, tmp_path):  # noqa: F811
    state, run_id, _ = costed_run
    rep = json.loads(cli_out(capsys, "cost", "report", run_id, "--format", "json"))
    page = tmp_path / "report.html"
    assert main(["cost", "report", run_id, "--format", "html", "--output", str(page)]) == 0

    shot = tmp_path / "shot.png"
    res = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,1800", page.as_uri())
    assert shot.exists(), res.stderr[-2000:]
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    assert pixels.shape[0] >= 1000 and pixels.shape[1] == 1280
    # Not blank: many distinct colours (text, bars, lines), and far from all-white.
    flat = (pixels[..., :3] * 255).astype(int).reshape(-1, 3)
    colours = {tuple(c) for c in flat[:: max(1, len(flat) // 200000)]}
    assert len(colours) > 50
    assert (flat.sum(axis=1) < 600).mean() > 0.01

    res = chromium(tmp_path, "--dump-dom", page.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    parser = Totals()
    parser.feed(res.stdout)
    t = rep["totals"]
    for k in ("total_usd", "ondemand_usd", "savings_usd", "lost_hours"):
        assert float(parser.found[k]) == t[k], k
    (run,) = rep["runs"]
    cells = {name: value for rid, name, value in parser.cells if rid == run_id}
    for k in ("total_usd", "ondemand_usd", "savings_usd", "estimate_usd", "lost_hours", "cost_per_1k_steps"):
        assert float(cells[k]) == run[k], k
    assert res.stdout.count("<svg") == 4
