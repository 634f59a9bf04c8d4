"""The run page in a real browser (headless Chromium over DevTools): drawn, every sample loaded, the
charts' points counted, the cost read from the rendered page, a sample enlarged by a click."""

from __future__ import annotations

import json
import os

import pytest

from sdcloud.cli import main
from tests.support import ROOT
from tests.support.server_chromium import Chromium, not_blank
from tests.views.conftest import CHECKPOINTS, PROMPTS

pytestmark = pytest.mark.slow

SAMPLES_LOADED = ("[...document.querySelectorAll('img.sample')].map(i => i.complete && i.naturalWidth > 0 "
                  "&& i.naturalHeight > 0)")


def points(chart: str) -> str:
    return f"document.querySelectorAll('#points-{chart} use').length"


def test_report_in_chromium(trained_run, capsys, tmp_path):
    _, run_id, _ = trained_run
    page_file = tmp_path / "page.html"
    assert main(["report", run_id, "-o", str(page_file)]) == 0
    capsys.readouterr()
    assert main(["report", run_id, "--format", "json"]) == 0
    page = json.loads(capsys.readouterr().out)
    assert main(["cost", "report", run_id, "--format", "json"]) == 0
    cost = json.loads(capsys.readouterr().out)

    with Chromium(tmp_path) as b:
        b.open(page_file.as_uri())
        loaded = b.eval(SAMPLES_LOADED)
        assert loaded == [True] * (len(PROMPTS) * len(CHECKPOINTS))
        assert b.eval(points("loss")) == len(page["metrics"]) == 30
        assert b.eval(points("cost_usd")) == len(page["metrics"])
        assert b.eval("document.querySelectorAll('tr[data-event=reclaim]').length") == 1
        shown = b.eval("document.querySelector('[data-total=total_usd]').textContent")
        assert float(shown) == cost["totals"]["total_usd"] > 0
        # Nothing was asked of the network: every resource is the file itself or a data: URI.
        assert b.eval("performance.getEntriesByType('resource').filter(r => !r.name.startsWith('data:')).length") == 0
        # A click on a sample opens it large.
        assert b.eval("document.getElementById('big').open") is False
        b.eval("document.querySelector('img.sample[data-step=\"20\"]').click()")
        assert b.eval("document.getElementById('big').open") is True
        assert b.eval("document.querySelector('#big img').naturalWidth") == 64
        b.eval("document.getElementById('big').close()")
        shot = b.screenshot(tmp_path / "page.png")
    not_blank(shot)
    if os.environ.get("SDCLOUD_DOCS_SHOTS") == "1":  # the docs' picture, made here (docs/dashboard.md)
        (ROOT / "docs" / "images").mkdir(exist_ok=True)
        (ROOT / "docs" / "images" / "run-page.png").write_bytes(shot.read_bytes())
