"""Sample images: THE one module that owns their layout in the run's store (the agent writes it, the
control plane's runs/records/samples.py reads it).

Bucket layout, relative to the run's prefix (`runs/<run_id>`):

    samples/<step:09d>/<NN>.png     the NN-th sample prompt rendered at that checkpoint's step
    samples/<step:09d>/<NN>.json    {"format": 1, "step", "index", "prompt", "seed", "sampler",
                                     "trainer", "width", "height", "gpu_s", "source"}

The images go up before their checkpoint's manifest (sync.py), so a checkpoint that survived a reclaim
always has its samples; pruning a checkpoint leaves its samples in place. `gpu_s` is the seconds the
trainer spent rendering that image (its share of the checkpoint's sampling time, where the trainer
says it; else 0): the cost report counts them as sampling, not training.

Every trainer renders the same prompts with the same seeds (prompt NN: `seed + NN`), so one prompt
compares across steps. Where each trainer leaves its images:
- builtin: `sample-NN.png` in the checkpoint folder (trainers/builtin/output.py), with `samples.json`
  beside them (prompts, seeds, sampler, seconds);
- kohya sd-scripts: `<output_dir>/sample/<output_name>_<step:06d>_<NN:02d>_<YYYYmmddHHMMSS>[_<seed>].png`
  (library/train_util.py sample_image_inference), from the prompt file we write;
- the diffusers scripts: the `validation` images their `log_validation` logs to the TensorBoard tracker
  (`<output_dir>/logs/`), read back from the event files (metrics.py's event reader).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = 1
SAMPLES = "samples"
# The builtin trainer's record of what it rendered, beside the images in its checkpoint folder.
BUILTIN_RECORD = "samples.json"
KOHYA_SAMPLE = re.compile(r"^(?:.+_)?(\d{6})_(\d{2})_\d{14}(?:_(\d+))?\.png$")
DIFFUSERS_SAMPLE = re.compile(r"^(\d{6})_(\d{2})\.png$")


@dataclass(frozen=True)
class SampleSettings:
    """What the user asked for: the prompts, every how many steps (0: at every checkpoint), the seed."""
    prompts: tuple[str, ...] = ()
    every: int = 0
    seed: int = 0
    sampler: str = "euler"
    steps: int = 20  # sampling steps of each image

    @classmethod
    def from_dict(cls, d: dict | None) -> "SampleSettings":
        d = d or {}
        return cls(prompts=tuple(str(p) for p in d.get("prompts") or ()), every=int(d.get("every") or 0),
                   seed=int(d.get("seed") or 0), sampler=str(d.get("sampler") or "euler"),
                   steps=int(d.get("steps") or 20))

    def as_dict(self) -> dict:
        return {"prompts": list(self.prompts), "every": self.every, "seed": self.seed, "sampler": self.sampler,
                "steps": self.steps}

    def interval(self, checkpoint_every: int) -> int:
        """Steps between samples: --sample-every, else the checkpoint interval."""
        return self.every or checkpoint_every

    def seed_of(self, index: int) -> int:
        return self.seed + index


@dataclass(frozen=True)
class Found:
    """One image a trainer wrote, and what it was."""
    path: Path
    step: int
    index: int
    meta: dict = field(default_factory=dict)


def step_prefix(run_prefix: str, step: int) -> str:
    return f"{run_prefix}/{SAMPLES}/{step:09d}"


def image_key(run_prefix: str, step: int, index: int) -> str:
    return f"{step_prefix(run_prefix, step)}/{index:02d}.png"


def meta_key(run_prefix: str, step: int, index: int) -> str:
    return f"{step_prefix(run_prefix, step)}/{index:02d}.json"


def parse_key(key: str) -> tuple[int, int, str] | None:
    """(step, index, "png" | "json") of a key under samples/, or None."""
    m = re.search(rf"/{SAMPLES}/(\d{{9}})/(\d{{2}})\.(png|json)$", key)
    return (int(m.group(1)), int(m.group(2)), m.group(3)) if m else None


def sampled_steps(store, run_prefix: str) -> set[int]:
    """The steps that have samples in the store."""
    out = set()
    for info in store.list(f"{run_prefix}/{SAMPLES}/"):
        parsed = parse_key(info.key)
        if parsed is not None and parsed[2] == "png":
            out.add(parsed[0])
    return out


def record(found: Found, settings: SampleSettings, trainer: str) -> dict:
    """The JSON beside an image: what the image is (never a secret: prompts and numbers only)."""
    meta = {"format": FORMAT, "step": found.step, "index": found.index,
            "prompt": settings.prompts[found.index] if found.index < len(settings.prompts) else "",
            "seed": settings.seed_of(found.index), "sampler": settings.sampler, "trainer": trainer,
            "gpu_s": 0.0, "source": found.path.name, "time": time.time()}
    meta.update({k: v for k, v in found.meta.items() if v is not None})
    try:
        from PIL import Image

        with Image.open(found.path) as im:
            meta["width"], meta["height"] = im.size
    except Exception:  # noqa: BLE001 - Pillow may be absent on a host; the size is a nicety
        pass
    return meta


def upload(store, run_prefix: str, found: list[Found], settings: SampleSettings, trainer: str) -> int:
    """Put each image and its JSON at samples/<step>/NN.*; returns how many went up. The caller
    retries (sync.py's retry) and commits the checkpoint's manifest only after this returned."""
    n = 0
    for f in found:
        meta = record(f, settings, trainer)
        store.put_file(image_key(run_prefix, f.step, f.index), f.path)
        store.put(meta_key(run_prefix, f.step, f.index), json.dumps(meta, sort_keys=True).encode())
        n += 1
    return n


# -- where each trainer leaves them ------------------------------------------------------------------

def builtin_samples(checkpoint: Path, step: int) -> list[Found]:
    """sample-NN.png in a builtin checkpoint folder, with the figures of its samples.json."""
    rec: dict = {}
    try:
        rec = json.loads((checkpoint / BUILTIN_RECORD).read_text())
    except (OSError, ValueError):
        pass
    per = {int(r.get("index", -1)): r for r in rec.get("images", []) if isinstance(r, dict)}
    out = []
    for p in sorted(checkpoint.glob("sample-*.png")):
        m = re.match(r"^sample-(\d+)\.png$", p.name)
        if m:
            i = int(m.group(1))
            r = per.get(i, {})
            out.append(Found(p, step, i, {k: r.get(k) for k in ("seed", "sampler", "gpu_s", "prompt")}))
    return out


def kohya_samples(output_dir: Path, step: int, local_step: int | None = None) -> list[Found]:
    """kohya's images of its own step `local_step` (default: `step`) in <output_dir>/sample/; the
    newest file wins where a step was rendered twice (a resumed attempt)."""
    folder = output_dir / "sample"
    want = step if local_step is None else local_step
    best: dict[int, Path] = {}
    if folder.is_dir():
        for p in sorted(folder.iterdir()):
            m = KOHYA_SAMPLE.match(p.name)
            if m and int(m.group(1)) == want:
                best[int(m.group(2))] = p
    return [Found(p, step, i, {}) for i, p in sorted(best.items())]


def diffusers_samples(output_dir: Path, step: int) -> list[Found]:
    folder = output_dir / "validation"
    out = []
    if folder.is_dir():
        for p in sorted(folder.iterdir()):
            m = DIFFUSERS_SAMPLE.match(p.name)
            if m and int(m.group(1)) == step:
                out.append(Found(p, step, int(m.group(2)), {}))
    return out


def kohya_prompt_file(settings: SampleSettings, path: Path, width: int, height: int) -> Path:
    """kohya's --sample_prompts file: one prompt a line with its options (`--d` seed, `--s` steps,
    `--w`/`--h` size), as library/train_util.py's line parser reads them."""
    lines = [f"{p.replace(chr(10), ' ')} --d {settings.seed_of(i)} --s {settings.steps} --w {width} --h {height}"
             for i, p in enumerate(settings.prompts)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
