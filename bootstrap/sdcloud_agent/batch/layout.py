"""Where a batch job's objects live in the store, and how an image's key is derived.

    <job>/job.json               the job: model, LoRA, tier, item ids (written once at submit)
    <job>/items/<item>.json      one work item: prompt, seeds, settings (written once at submit)
    <job>/leases/<item>.json     the current claim: worker, token, expiry (create, then compare-and-swap)
    <job>/images/<key>.png       one image; key = hash of everything that determines it (create-only)
    <job>/done/<item>.json       the done marker: image keys and index lines (create-only; the one winner)
    <job>/index/<worker>.jsonl   one JSONL index per worker: the lines of the items it completed
    <job>/cancel                 present when the job is cancelled: workers stop claiming
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

# Everything that determines an image's pixels, in key order. Two requests that agree on these
# are the same image, so they share one key and one object.
IMAGE_FIELDS = ("model", "lora", "prompt", "negative_prompt", "seed", "steps", "guidance", "width", "height",
                "scheduler")


def image_key(settings: dict[str, Any], seed: int) -> str:
    ident = {f: settings.get(f) for f in IMAGE_FIELDS}
    ident["seed"] = int(seed)
    blob = json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def job_key(job: str) -> str:
    return f"{job.strip('/')}/job.json"


def item_key(job: str, item: str) -> str:
    return f"{job}/items/{item}.json"


def lease_key(job: str, item: str) -> str:
    return f"{job}/leases/{item}.json"


def image_path(job: str, key: str) -> str:
    return f"{job}/images/{key}.png"


def done_key(job: str, item: str) -> str:
    return f"{job}/done/{item}.json"


def index_key(job: str, worker: str) -> str:
    return f"{job}/index/{worker}.jsonl"


def cancel_key(job: str) -> str:
    return f"{job}/cancel"
