"""A run's sample images, read from its store (`sdcloud samples`, `pull --list`, the run page).

The layout is the agent's (bootstrap/sdcloud_agent/samples.py owns it), relative to the store's root:

    runs/<run_id>/samples/<step:09d>/<NN>.png     the NN-th sample prompt at that checkpoint's step
    runs/<run_id>/samples/<step:09d>/<NN>.json    {"step", "index", "prompt", "seed", "sampler", "trainer",
                                                   "width", "height", "gpu_s", ...}

An image without its JSON (a host reclaimed between the two PUTs) is listed with what its key says;
a JSON without its image is not a sample. `store` is the run's store as runs/records opens it
(`artifacts.run_store(run)`, or `store.open_run_store(conf)`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from sdcloud_agent import samples as layout

from ...errors import UserError
from .store import ObjectStore, StoreError


@dataclass(frozen=True)
class Sample:
    step: int
    index: int
    prompt: str
    seed: int | None
    sampler: str
    key: str  # the PNG's key in the run's store
    size: int = 0
    trainer: str = ""
    gpu_s: float = 0.0
    width: int | None = None
    height: int | None = None
    store: ObjectStore | None = field(default=None, repr=False, compare=False)

    def read_bytes(self) -> bytes:
        if self.store is None:
            raise StoreError(f"no store to read {self.key} from")
        return self.store.get(self.key)

    @property
    def name(self) -> str:
        """Its file name in a download: <step:09d>/<NN>.png."""
        return f"{self.step:09d}/{self.index:02d}.png"

    def as_dict(self) -> dict:
        return {"step": self.step, "index": self.index, "prompt": self.prompt, "seed": self.seed,
                "sampler": self.sampler, "key": self.key, "size": self.size, "trainer": self.trainer,
                "gpu_s": self.gpu_s, "width": self.width, "height": self.height}


def list_samples(store: ObjectStore, run_id: str, step: int | None = None) -> list[Sample]:
    """The run's samples, by step then index (only `step`'s, if given)."""
    prefix = f"runs/{run_id}/{layout.SAMPLES}/" + (f"{step:09d}/" if step is not None else "")
    pngs: dict[tuple[int, int], int] = {}
    metas: list[str] = []
    for info in store.list(prefix):
        parsed = layout.parse_key(info.key)
        if parsed is None:
            continue
        s, i, ext = parsed
        if ext == "png":
            pngs[(s, i)] = info.size
        else:
            metas.append(info.key)
    meta: dict[tuple[int, int], dict] = {}
    for key in metas:
        s, i, _ = layout.parse_key(key)
        if (s, i) in pngs:
            try:
                meta[(s, i)] = json.loads(store.get(key))
            except (StoreError, ValueError):
                pass  # the image is still a sample; its JSON is a nicety
    out = []
    for (s, i), size in sorted(pngs.items()):
        m = meta.get((s, i), {})
        out.append(Sample(step=s, index=i, prompt=str(m.get("prompt") or ""), seed=_int(m.get("seed")),
                          sampler=str(m.get("sampler") or ""), key=layout.image_key(f"runs/{run_id}", s, i),
                          size=size, trainer=str(m.get("trainer") or ""), gpu_s=float(m.get("gpu_s") or 0.0),
                          width=_int(m.get("width")), height=_int(m.get("height")), store=store))
    return out


def sample_steps(store: ObjectStore, run_id: str) -> dict[int, int]:
    """step -> how many samples it has."""
    out: dict[int, int] = {}
    for s in list_samples(store, run_id):
        out[s.step] = out.get(s.step, 0) + 1
    return out


def sampling_seconds(store: ObjectStore, run_id: str) -> float:
    """The GPU seconds spent rendering the run's samples (the cost report's sampling share)."""
    return round(sum(s.gpu_s for s in list_samples(store, run_id)), 3)


def download(samples: list[Sample], dest: Path) -> list[Path]:
    """Each sample to dest/<step:09d>/<NN>.png, with its JSON beside it; a file already there with the
    same size is kept."""
    out = []
    for s in samples:
        target = dest / s.name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not (target.is_file() and target.stat().st_size == s.size):
            try:
                target.write_bytes(s.read_bytes())
            except StoreError as exc:
                raise UserError(f"cannot download {s.key}: {exc}") from None
        target.with_suffix(".json").write_text(json.dumps(s.as_dict(), indent=1, sort_keys=True) + "\n")
        out.append(target)
    return out


def _int(v) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None
