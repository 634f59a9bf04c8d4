"""The dashboard in a real browser while a local job trains: the list shows it running, and its page
gains samples and points as they land, with no reload (headless Chromium over DevTools)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.dashboard.conftest import dashboard, get
from tests.support import ROOT
from tests.support.server_chromium import Chromium, not_blank

pytestmark = pytest.mark.slow

STEPS, EVERY = 12, 4
JOB_LIMIT_S = 420.0


def test_a_training_runs_page_updates_in_place(tmp_path):
    with dashboard() as (base, _):
        up = subprocess.Popen([sys.executable, "-m", "sdcloud.cli", "up", "--provider", "local", "--tier", "sd15-lora",
                               "--model", "tiny", "--steps", str(STEPS), "--checkpoint-every", str(EVERY),
                               "--sample-prompt", "a red cube", "--yes", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        try:
            deadline = time.monotonic() + JOB_LIMIT_S
            jobs: list = []
            while not jobs:
                assert time.monotonic() < deadline and up.poll() is None, up.stderr.read()[-2000:] if up.poll() else ""
                jobs = json.loads(get(base + "/api/jobs")[2])["jobs"]
                time.sleep(0.2)
            run_id = jobs[0]["run"]
            listed = get(base + "/")[2]
            assert f'<tr data-run="{run_id}"' in listed
            assert jobs[0]["state"] in ("pending", "launching", "running")

            with Chromium(tmp_path) as b:
                b.open(f"{base}/runs/{run_id}")
                b.eval("window.sameDocument = 'yes'")  # gone if the page were loaded again
                samples0 = b.eval("document.querySelectorAll('img.sample').length")
                points0 = b.eval("document.querySelectorAll('#points-loss use').length")
                assert samples0 < STEPS // EVERY  # opened before the job ended
                left = max(1.0, deadline - time.monotonic())
                b.wait_for(f"document.querySelectorAll('img.sample').length > {samples0} && "
                           f"document.querySelectorAll('#points-loss use').length > {points0}", timeout=left)
                assert b.eval("window.sameDocument") == "yes"
                assert b.eval("performance.getEntriesByType('navigation').length") == 1
                assert int(b.eval("document.body.dataset.updates")) >= 1

                out, err = up.communicate(timeout=max(1.0, deadline - time.monotonic()))
                assert up.returncode == 0, err[-3000:]
                assert json.loads(out)["state"] == "succeeded"
                b.wait_for("document.querySelector('[data-field=state]').textContent === 'succeeded' && "
                           f"document.querySelectorAll('img.sample').length === {STEPS // EVERY}", timeout=60)
                page = json.loads(get(f"{base}/api/runs/{run_id}")[2])
                b.wait_for(f"document.querySelectorAll('#points-loss use').length === {len(page['metrics'])}", timeout=30)
                assert len(page["metrics"]) == STEPS
                assert b.eval("[...document.querySelectorAll('img.sample')].every(i => i.complete && i.naturalWidth > 0)")
                assert b.eval("window.sameDocument") == "yes"
                # A click shows the sample at full size, fetched from the dashboard.
                b.eval("document.querySelector('img.sample').click()")
                b.wait_for("document.querySelector('#big img').complete && "
                           "document.querySelector('#big img').naturalWidth > 0", timeout=30)
                assert "/image?key=" in b.eval("document.querySelector('#big img').src")
                b.eval("document.getElementById('big').close()")
                shot = b.screenshot(tmp_path / "run.png")
                b.open(base + "/")
                assert b.eval("document.querySelectorAll('img.sample.last').length") == 1
                listed_shot = b.screenshot(tmp_path / "list.png")
        finally:
            if up.poll() is None:
                up.terminate()
                up.wait(timeout=60)
    not_blank(shot)
    if os.environ.get("SDCLOUD_DOCS_SHOTS") == "1":  # the docs' pictures, made here (docs/dashboard.md)
        (ROOT / "docs" / "images").mkdir(exist_ok=True)
        (ROOT / "docs" / "images" / "dashboard-run.png").write_bytes(shot.read_bytes())
        (ROOT / "docs" / "images" / "dashboard-list.png").write_bytes(listed_shot.read_bytes())
