"""Check a batch job in its bucket: every item done once, every image present once, indexes agree."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from . import layout
from .worker import read_items


@dataclass
class Verdict:
    items: int = 0
    items_done: int = 0
    images_expected: int = 0
    images_present: int = 0
    redone_items: int = 0                                  # finished on a second or later attempt
    missing_items: list[str] = field(default_factory=list)
    missing_images: list[str] = field(default_factory=list)
    duplicate_keys: list[str] = field(default_factory=list)  # one key claimed by two items or two index lines
    index_mismatches: list[str] = field(default_factory=list)
    stray_images: list[str] = field(default_factory=list)    # objects no done marker names (an item not done yet)

    @property
    def ok(self) -> bool:
        return not (self.missing_items or self.missing_images or self.duplicate_keys or self.index_mismatches)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def done_markers(store: Any, job: str) -> dict[str, dict[str, Any]]:
    out = {}
    for o in store.list(f"{job}/done/"):
        marker = json.loads(store.get(o.key))
        out[marker["item"]] = marker
    return out


def index_lines(store: Any, job: str) -> list[dict[str, Any]]:
    lines = []
    for o in store.list(f"{job}/index/"):
        lines += [json.loads(ln) for ln in store.get(o.key).decode().splitlines() if ln.strip()]
    return lines


def verify(store: Any, job: str) -> Verdict:
    v = Verdict()
    items = read_items(store, job)
    markers = done_markers(store, job)
    present = {o.key.rsplit("/", 1)[-1].removesuffix(".png") for o in store.list(f"{job}/images/")}
    v.items, v.items_done, v.images_present = len(items), len(markers), len(present)
    expected: Counter[str] = Counter()
    for it in items:
        keys = [layout.image_key(it["settings"], s) for s in it["seeds"]]
        expected.update(keys)
        m = markers.get(it["id"])
        if m is None:
            v.missing_items.append(it["id"])
            continue
        v.redone_items += int(m.get("attempt", 1)) > 1
        if sorted(ln["key"] for ln in m["images"]) != sorted(keys):
            v.index_mismatches.append(f"{it['id']}: done marker names other images than the item's seeds")
        v.missing_images += [k for k in keys if k not in present]
    v.images_expected = len(expected)
    v.duplicate_keys = sorted(k for k, n in expected.items() if n > 1)
    # The per-worker indexes: each image once, and only by the worker whose done marker won.
    seen: Counter[str] = Counter(ln["key"] for ln in index_lines(store, job))
    v.duplicate_keys += sorted(k for k, n in seen.items() if n > 1)
    owner = {ln["key"]: m["worker"] for m in markers.values() for ln in m["images"]}
    for ln in index_lines(store, job):
        if owner.get(ln["key"]) != ln["worker"]:
            v.index_mismatches.append(f"{ln['key']}: indexed by {ln['worker']}, done by {owner.get(ln['key'])}")
    v.stray_images = sorted(present - set(expected))
    return v
