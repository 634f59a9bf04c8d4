"""The gallery renders offline in headless Chromium: the screenshot is not blank and shows every image."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from sdcloud.batch.gallery import write_gallery

COLOURS = [(220, 30, 30), (30, 200, 40), (40, 60, 230), (240, 200, 20), (200, 40, 220), (20, 210, 210)]


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    return exe


def test_gallery_renders_every_image_in_headless_chromium(tmp_path):
    from PIL import Image

    out = tmp_path / "job"
    (out / "images").mkdir(parents=True)
    lines = []
    for n, colour in enumerate(COLOURS):
        key = f"k{n:031d}"
        Image.new("RGB", (96, 96), colour).save(out / "images" / f"{key}.png")
        lines.append({"key": key, "prompt": f"a <b>bold</b> product {n}", "negative_prompt": "blurry", "seed": n,
                      "width": 96, "height": 96, "steps": 20, "guidance": 7.5, "scheduler": "ddim", "item": "i1"})
    page = write_gallery(out, lines, title="gallery test")
    html = page.read_text()
    assert html.count("<figure") == len(COLOURS) and "&lt;b&gt;bold" in html, "prompts are escaped"
    assert "http://" not in html and "https://" not in html and "<script" not in html, "self-contained and offline"
    shot = tmp_path / "shot.png"
    profile = tmp_path / "profile"
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", "--hide-scrollbars", "--window-size=1400,1000",
           f"--screenshot={shot}", page.as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=120)
    assert shot.exists(), "chromium wrote no screenshot"
    im = Image.open(shot).convert("RGB")
    colours = im.getcolors(maxcolors=1 << 20)
    assert colours and len(colours) > 8, "the screenshot is blank"
    counts = {c: n for n, c in colours}
    for colour in COLOURS:
        near = sum(n for c, n in counts.items() if all(abs(a - b) <= 12 for a, b in zip(c, colour)))
        assert near > 2000, f"image of colour {colour} is not on the page"
    dom = subprocess.run(cmd[:-2] + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    for ln in lines:
        assert f'data-key="{ln["key"]}"' in dom and f"seed {ln['seed']}" in dom
