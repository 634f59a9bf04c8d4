"""The run page of a real run: `up --sample-prompt` twice on the local provider, 30 steps, a checkpoint every
10, reclaimed once; `report --format json` has the 30 loss points and the reclaim, and the HTML page
renders in Chromium with the 6 samples loaded and a marker per point; no secret of config.toml on it."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_samples_e2e import HF_SECRET, WANDB_SECRET, run, sdcloud  # noqa: F401 - the run fixture
from tests.support.server_chromium import Chromium, not_blank

pytestmark = pytest.mark.slow


def test_the_reclaimed_runs_page(run, tmp_path):  # noqa: F811
    proc = sdcloud(run["home"], "report", run["id"], "--format", "json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = json.loads(proc.stdout)
    assert [m["step"] for m in page["metrics"]] == list(range(1, 31))
    assert all(m["loss"] is not None for m in page["metrics"])
    assert [e["kind"] for e in page["events"] if e["group"] == "reclaim"]  # the notice and the reclaim
    assert sorted(e["step"] for e in page["events"] if e["kind"] == "checkpoint") == [10, 20, 30]
    assert len(page["samples"]) == 6
    assert [a["cause"] for a in page["attempts"]] == ["preempted", "succeeded"]
    cost = json.loads(sdcloud(run["home"], "cost", "report", run["id"], "--format", "json").stdout)
    assert page["header"]["cost_usd"] == cost["runs"][0]["total_usd"]

    out = tmp_path / "page.html"
    proc = sdcloud(run["home"], "report", run["id"], "-o", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    assert HF_SECRET not in text and WANDB_SECRET not in text and HF_SECRET not in proc.stdout
    with Chromium(tmp_path) as b:
        b.open(out.as_uri())
        assert b.eval("[...document.querySelectorAll('img.sample')].filter(i => i.complete && i.naturalWidth > 0).length") == 6
        assert b.eval("document.querySelectorAll('#points-loss use').length") == 30
        assert b.eval("document.querySelectorAll('tr[data-event=reclaim]').length") >= 1
        not_blank(b.screenshot(tmp_path / "page.png"))
