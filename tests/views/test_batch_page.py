"""A batch job's page: the gallery of its images, images/s, workers and cost per image, as
`batch status` counts them; and in the browser every image of the gallery loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sdcloud.cli import main
from tests.support.server_chromium import Chromium

pytestmark = pytest.mark.slow


@pytest.fixture
def batch_job(tmp_path) -> str:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a red cube", "steps": 2}\n{"prompt": "a blue sphere", "steps": 2}\n')
    sub = subprocess.run([sys.executable, "-m", "sdcloud.cli", "batch", "submit", "--tier", "batch-sd15", "--model", "tiny",
                          "--prompts", str(prompts), "--images-per-prompt", "2", "--workers", "2", "--json"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "SDCLOUD_CPU_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    assert sub.returncode == 0, sub.stderr[-2000:]
    return json.loads(sub.stdout)["job"]


def test_batch_job_page_has_the_gallery_and_the_job_figures(batch_job, capsys, tmp_path):
    capsys.readouterr()
    assert main(["batch", "status", batch_job, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert main(["report", batch_job, "--format", "json"]) == 0
    page = json.loads(capsys.readouterr().out)
    assert page["kind"] == "batch"
    b = page["batch"]
    assert b["images_done"] == status["images_done"] == 4 and b["gallery_total"] == 4
    assert b["workers"] == 2 and b["images_per_s"] > 0
    assert b["cost_per_image_usd"] == status["cost_per_image_usd"]
    assert len(b["gallery"]) == 4 and all(g["src"].startswith("data:image/png;base64,") for g in b["gallery"])
    assert page["header"]["cost_usd"] == status["cost_usd"]
    out = tmp_path / "job.html"
    assert main(["report", batch_job, "-o", str(out)]) == 0
    text = out.read_text()
    assert text.count('class="sample"') == 4 and 'data-field="images_per_s"' in text and 'data-field="workers"' in text
    with Chromium(tmp_path) as br:
        br.open(out.as_uri())
        assert br.eval("[...document.querySelectorAll('img.sample')].filter(i => i.naturalWidth > 0).length") == 4
