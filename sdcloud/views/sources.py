"""What a page reads from a run's store: its samples, its metrics stream and a batch job's images.

The samples and the metrics have one reader each (runs/records/samples.py, runs/records/metrics.py);
this module only turns their records into plain dicts for a page, and adds the image bytes as data
URIs so the page needs nothing but itself.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

# A batch job's gallery shows at most this many images (the newest); `batch pull` has them all.
GALLERY_LIMIT = 120
# Images wider or taller than this are inlined as a thumbnail of this size: a run with 20 checkpoints
# of 4 SDXL samples would otherwise be a page of 100+ MB. `sdcloud samples -o DIR` has the originals.
THUMB_PX = 256


def _plain(record: Any) -> dict:
    """A reader's record as a dict, whatever type the reader returns it as."""
    if isinstance(record, dict):
        return dict(record)
    if hasattr(record, "as_dict"):  # the readers' own: a Sample's store is not part of it
        return dict(record.as_dict())
    if dataclasses.is_dataclass(record):
        return dataclasses.asdict(record)
    if hasattr(record, "_asdict"):
        return dict(record._asdict())
    return dict(vars(record))


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def thumbnail(data: bytes, px: int = THUMB_PX) -> bytes:
    """The PNG itself when it fits in px x px, else a PNG thumbnail of it (the bytes as they are when
    Pillow cannot read them: the browser shows what it can)."""
    import io

    try:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as im:
            if im.width <= px and im.height <= px:
                return data
            im = im.convert("RGB")
            im.thumbnail((px, px))
            buf = io.BytesIO()
            im.save(buf, format="PNG")
            return buf.getvalue()
    except Exception:  # noqa: BLE001 - a bad file still gets a tile rather than no page
        return data


def samples(store: Any, run_id: str, with_images: bool = True) -> list[dict]:
    """Every sample of the run, sorted by step and index: step, index, prompt, seed, sampler, key and
    (with_images) src, the PNG (or its thumbnail) as a data URI. A sample whose PNG cannot be read is
    left out."""
    from ..runs.records.samples import list_samples

    out = []
    for rec in list_samples(store, run_id):
        s = _plain(rec)
        key = s.get("key") or s.get("image") or s.get("png")
        row = {"step": int(s["step"]), "index": int(s.get("index", s.get("n", 0)) or 0), "prompt": s.get("prompt"),
               "seed": s.get("seed"), "sampler": s.get("sampler"), "key": key}
        if with_images:
            try:
                row["src"] = data_uri(thumbnail(store.get(key)))
            except Exception:  # noqa: BLE001 - a sample lost with a pruned checkpoint is not an error of the page
                continue
        out.append(row)
    return sorted(out, key=lambda r: (r["step"], r["index"]))


# The metrics fields a page shows, and the names the stream may give them.
FIELDS = {"t": ("t", "time", "ts", "at"), "step": ("step",), "loss": ("loss", "loss_raw"),
          "loss_smooth": ("loss_smooth", "loss_smoothed", "smoothed_loss"), "lr": ("lr", "learning_rate"),
          "steps_per_s": ("steps_per_s", "it_per_s", "steps_s"), "data_wait_s": ("data_wait_s", "data_wait"),
          "gpu_util": ("gpu_util", "gpu_util_pct", "gpu_utilization"), "mem_used": ("mem_used", "mem_used_mib", "memory_used"),
          "temp": ("temp", "temp_c", "temperature"), "power": ("power", "power_w"),
          "throttling": ("throttling",), "attempt": ("attempt",),
          "cost_usd": ("cost_usd", "cost")}


def _field(row: dict, names: tuple[str, ...]) -> Any:
    return next((row[n] for n in names if row.get(n) is not None), None)


def metrics(store: Any, run_id: str) -> list[dict]:
    """The run's metrics rows, one a step, oldest first (runs/records/metrics.py)."""
    from ..runs.records.metrics import read_metrics

    out = [{k: _field(_plain(rec), names) for k, names in FIELDS.items()} for rec in read_metrics(store, run_id)]
    return sorted((r for r in out if r["t"] is not None), key=lambda r: (r["t"], r["step"] or 0))


def run_events(state: Any, store: Any, run_id: str) -> list[dict]:
    """The controller's marked events and the store's checkpoints, on the same time axis, as dicts."""
    from ..runs.records.metrics import read_run_events

    return [{"t": ev.time, "kind": ev.kind, "words": ev.words, "step": ev.step, "cost_usd": ev.cost_usd}
            for ev in read_run_events(state, store, run_id)]


def batch_images(job: dict, limit: int = GALLERY_LIMIT) -> tuple[list[dict], int]:
    """A batch job's newest images (prompt, seed, key, src) and how many it has made in all."""
    from sdcloud_agent.batch import layout
    from sdcloud_agent.batch.verify import done_markers

    from ..batch.status import job_store

    store = job_store(job)
    prefix = job["spec"]["prefix"]
    markers = done_markers(store, prefix).values()
    lines = sorted((ln for m in markers for ln in m["images"]), key=lambda ln: (ln.get("item"), ln.get("seed")))
    shown = []
    for ln in lines[-limit:]:
        try:
            src = data_uri(thumbnail(store.get(layout.image_path(prefix, ln["key"]))))
        except Exception:  # noqa: BLE001 - an image not yet readable is shown on the next refresh
            continue
        shown.append({"key": ln["key"], "prompt": ln.get("prompt"), "seed": ln.get("seed"), "item": ln.get("item"),
                      "src": src})
    return shown, len(lines)


def as_json(value: Any) -> str:
    return json.dumps(value, indent=2, default=str) + "\n"
