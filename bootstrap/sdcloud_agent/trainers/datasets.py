"""The dataset layout every trainer is given, checked before launch and converted on the host.

The layout (docs/training.md): a folder of images (png, jpg, jpeg, webp, bmp), each with an
optional caption in a same-name ``.txt`` file, in any depth of subfolders; images without a caption
use the run's instance prompt. A subfolder named ``<N>_<name>`` repeats its images N times per
epoch (kohya's convention, honoured by the kohya conversion).

For kohya sd-scripts it becomes a ``dataset_config`` TOML (one subset per folder, its repeats,
``caption_extension``); for the diffusers examples an ``imagefolder`` with ``metadata.jsonl``
(a ``file_name`` and a ``text`` caption column). Pillow is needed only to check readability.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

IMAGE_EXTS = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}
# Files that may sit beside the images without being an error.
SIDE_EXTS = {".txt", ".caption", ".json", ".jsonl", ".toml", ".md"}
REPEATS = re.compile(r"^(\d+)_(.+)$")


@dataclass
class DatasetScan:
    folder: Path
    images: list[Path] = field(default_factory=list)
    captioned: int = 0
    unreadable: list[str] = field(default_factory=list)  # images Pillow cannot open, with why
    strays: list[str] = field(default_factory=list)  # files that are neither images nor captions
    smallest: tuple[int, int] | None = None  # (width, height) of the image with the fewest pixels

    def problem(self) -> str | None:
        """One line for the first thing that stops a run, or None."""
        if self.unreadable:
            return (f"dataset {self.folder}: {len(self.unreadable)} unreadable image(s): "
                    + "; ".join(self.unreadable[:3]))
        if self.strays:
            return (f"dataset {self.folder}: {len(self.strays)} file(s) that are not images "
                    f"({', '.join(sorted(IMAGE_EXTS))}) nor .txt captions: " + ", ".join(self.strays[:3]))
        if not self.images:
            return f"dataset {self.folder}: no images ({', '.join(sorted(IMAGE_EXTS))})"
        return None

    def summary(self) -> str:
        w, h = self.smallest or (0, 0)
        return f"{len(self.images)} images, {self.captioned} with captions, smallest {w}x{h}"


def _visible(folder: Path, path: Path) -> bool:
    return not any(part.startswith(".") for part in path.relative_to(folder).parts)


def scan(folder: Path, check_images: bool = True) -> DatasetScan:
    """Every file under folder, sorted into images, captions and strays; each image opened."""
    out = DatasetScan(folder)
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and _visible(folder, p)):
        ext = f.suffix.lower()
        rel = str(f.relative_to(folder))
        if ext in IMAGE_EXTS:
            out.images.append(f)
            if f.with_suffix(".txt").is_file():
                out.captioned += 1
        elif ext not in SIDE_EXTS:
            out.strays.append(rel)
    if check_images and out.images:
        from PIL import Image

        for f in out.images:
            try:
                with Image.open(f) as im:
                    im.verify()  # reads the whole file: a truncated image fails here
                with Image.open(f) as im:
                    size = im.size
            except Exception as exc:  # noqa: BLE001 - Pillow raises many kinds for bad files
                # The file is named once, before; Pillow's message repeats its whole path, which
                # cut to 60 characters left only a piece of the path and none of the why.
                why = str(exc).replace(f"'{f}'", "").replace(str(f), "").strip().rstrip(":").strip()
                out.unreadable.append(f"{f.relative_to(folder)} ({type(exc).__name__}" + (f": {why[:60]})" if why else ")"))
                continue
            if out.smallest is None or size[0] * size[1] < out.smallest[0] * out.smallest[1]:
                out.smallest = size
    return out


def folders_with_images(folder: Path) -> list[Path]:
    return sorted({f.parent for f in scan(folder, check_images=False).images})


def images_per_epoch(folder: Path) -> int:
    """Images kohya sees per epoch: each folder's images times its repeats."""
    images = scan(folder, check_images=False).images
    total = 0
    for f in images:
        m = REPEATS.match(f.parent.name) if f.parent != folder else None
        total += int(m.group(1)) if m else 1
    return total


def kohya_config(folder: Path, dest: Path, resolution: int, batch_size: int, instance_prompt: str,
                 buckets: bool = True) -> Path:
    """A kohya dataset_config TOML: one subset per folder holding images, with its repeats
    (``10_name`` -> 10), captions from ``.txt`` and the instance prompt for the rest."""
    lines = ["[general]", 'caption_extension = ".txt"', "shuffle_caption = false", "",
             "[[datasets]]", f"resolution = [{resolution}, {resolution}]",
             f"batch_size = {batch_size}", f"enable_bucket = {'true' if buckets else 'false'}", ""]
    for sub in folders_with_images(folder):
        m = REPEATS.match(sub.name) if sub != folder else None
        lines += ["[[datasets.subsets]]", f"image_dir = {json.dumps(str(sub))}",
                  f"num_repeats = {int(m.group(1)) if m else 1}",
                  f"class_tokens = {json.dumps(instance_prompt)}", 'caption_extension = ".txt"', ""]
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("\n".join(lines), encoding="utf-8")
    return dest


def imagefolder(folder: Path, dest: Path, instance_prompt: str, metadata: bool = True) -> Path:
    """An ``imagefolder`` dataset for the diffusers examples: the images linked flat into dest
    (names made unique from their subfolder) and metadata.jsonl with each one's caption. Without
    metadata: only the flat images (``--instance_data_dir`` opens every file in its folder)."""
    dest.mkdir(parents=True, exist_ok=True)
    rows = []
    for f in scan(folder, check_images=False).images:
        name = "__".join(f.relative_to(folder).parts)
        target = dest / name
        if not target.exists():
            try:
                os.link(f, target)
            except OSError:
                os.symlink(f.resolve(), target)
        cap = f.with_suffix(".txt")
        text = cap.read_text(encoding="utf-8").strip() if cap.is_file() else ""
        rows.append({"file_name": name, "text": text or instance_prompt})
    if not metadata:
        return dest
    with open(dest / "metadata.jsonl", "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    return dest
