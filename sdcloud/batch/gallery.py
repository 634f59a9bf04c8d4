"""The gallery: one offline index.html beside the pulled images, with thumbnails, prompt, seed,
settings, and the model and LoRA that made them.

Thumbnails are embedded as data: URIs so the page needs nothing but itself; each links to its full
image in images/. No scripts, no fonts, no network.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

THUMB_PX = 256

CSS = """body{font:14px system-ui,sans-serif;margin:16px;background:#f4f4f4;color:#222}
h1{font-size:18px}.grid{display:flex;flex-wrap:wrap;gap:12px}
figure{margin:0;background:#fff;padding:8px;border:1px solid #ccc;width:260px}
figure img{width:256px;height:auto;display:block;background:#ddd}
figcaption{font-size:12px;word-wrap:break-word}.s{color:#666}"""


def _thumb(path: Path) -> str:
    """A PNG thumbnail as a data URI (the image itself when Pillow cannot read it)."""
    try:
        from PIL import Image

        with Image.open(path) as im:
            im = im.convert("RGB")
            im.thumbnail((THUMB_PX, THUMB_PX))
            buf = io.BytesIO()
            im.save(buf, format="PNG")
            data = buf.getvalue()
    except Exception:  # noqa: BLE001 - a bad file still gets a (broken) tile rather than no page
        data = path.read_bytes()
    return "data:image/png;base64," + base64.b64encode(data).decode()


def made_with(ln: dict[str, Any]) -> str:
    """The model and LoRA an image was made with, in words: `tiny + LoRA r-1a2b@sha256:...`."""
    lora = ln.get("lora")
    return f"{ln.get('model') or 'unknown model'}" + (f" + LoRA {lora}" if lora else ", no LoRA")


def write_gallery(out: Path, lines: list[dict[str, Any]], title: str = "sdcloud batch") -> Path:
    tiles = []
    for ln in lines:
        img = out / "images" / f"{ln['key']}.png"
        settings = (f"{made_with(ln)} · {ln.get('width')}x{ln.get('height')}, {ln.get('steps')} steps, "
                    f"guidance {ln.get('guidance')}, {ln.get('scheduler')}")
        neg = f"<br><span class=s>negative: {html.escape(ln['negative_prompt'])}</span>" if ln.get("negative_prompt") else ""
        tiles.append(
            f'<figure data-key="{ln["key"]}"><a href="images/{ln["key"]}.png">'
            f'<img alt="seed {ln["seed"]}" src="{_thumb(img)}"></a>'
            f"<figcaption>{html.escape(str(ln.get('prompt')))}{neg}<br>"
            f"<span class=s>seed {ln['seed']} · {html.escape(settings)}</span></figcaption></figure>")
    page = (f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{html.escape(title)} · {len(lines)} images</h1>"
            f"<p class=s>{html.escape('; '.join(dict.fromkeys(made_with(ln) for ln in lines)))}</p>"
            f"<div class=grid>{''.join(tiles)}</div></body></html>\n")
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path
