"""`sdcloud batch pull`: a job's images, one merged index.jsonl and the gallery, into a folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .status import find_job, job_store, state_store


def pull(job_id: str, dest: str | None, force: bool = False) -> dict[str, Any]:
    """Download the images, one merged index.jsonl (from the done markers) and the gallery.

    Into a new or empty folder, or an earlier pull of the same job (then only missing images are
    fetched); any other folder only with `force`, so that two jobs' images never mix unasked.
    """
    from ..runs.records import pulls
    from sdcloud_agent.batch import layout
    from sdcloud_agent.batch.verify import done_markers

    from .gallery import write_gallery

    job = find_job(job_id)
    store = job_store(job)
    prefix = job["spec"]["prefix"]
    out = Path(dest or job["id"]).expanduser()
    pulls.check_destination(state_store(), job["id"], out, force, f"batch job {job['id']}")
    (out / "images").mkdir(parents=True, exist_ok=True)
    lines = sorted((ln for m in done_markers(store, prefix).values() for ln in m["images"]),
                   key=lambda ln: (ln["item"], ln["seed"]))
    _add_model_and_lora(store, prefix, lines)
    fetched = 0
    for ln in lines:
        target = out / "images" / f"{ln['key']}.png"
        if not target.exists():
            store.get_file(layout.image_path(prefix, ln["key"]), target)
            fetched += 1
    (out / "index.jsonl").write_text("".join(json.dumps(ln, sort_keys=True) + "\n" for ln in lines))
    write_gallery(out, lines, title=f"sdcloud batch {job_id}")
    pulls.record(state_store(), job["id"], out)
    return {"job": job_id, "dir": str(out), "images": len(lines), "fetched": fetched,
            "gallery": str(out / "index.html")}


def _add_model_and_lora(store, prefix: str, lines: list[dict[str, Any]]) -> None:
    """Give each index line the model and LoRA its item was made with. Workers record both; lines
    from workers of an older sdcloud do not, and take them from their item."""
    from sdcloud_agent.batch.worker import read_items

    older = [ln for ln in lines if "model" not in ln or "lora" not in ln]
    if not older:
        return
    settings = {it["id"]: it["settings"] for it in read_items(store, prefix)}  # one read: items.jsonl
    for ln in older:
        ln.setdefault("model", settings[ln["item"]].get("model"))
        ln.setdefault("lora", settings[ln["item"]].get("lora"))
