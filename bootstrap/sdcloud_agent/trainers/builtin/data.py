"""The training data: synthetic images or a folder of them with captions, aspect buckets, and a batch
order and noise that depend only on (seed, step), so a resumed run draws what the uninterrupted one
would have.
"""

from __future__ import annotations

import argparse
import hashlib
import math
from pathlib import Path
from typing import Any

from .protocol import UsageError


IMAGE_EXTS = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}


def step_seed(seed: int, step: int, purpose: str) -> int:
    """A 63-bit seed that depends only on (seed, step, purpose): resume-proof randomness."""
    digest = hashlib.sha256(f"{seed}:{step}:{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def synthetic_images(n: int, resolution: int) -> list[dict[str, Any]]:
    """n deterministic images (gradient + rectangles), each as HWC uint8, with a caption."""
    import numpy as np

    out = []
    yy, xx = np.mgrid[0:resolution, 0:resolution] / max(resolution - 1, 1)
    for i in range(n):
        rng = np.random.default_rng(10_000 + i)
        c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
        img = c0 * (1 - xx[..., None]) + c1 * yy[..., None]
        for _ in range(3):
            x0, y0 = rng.integers(0, resolution, 2)
            w, h = rng.integers(resolution // 8, resolution // 2 + 1, 2)
            img[y0:y0 + h, x0:x0 + w] = rng.uniform(0, 255, 3)
        arr = np.clip(img, 0, 255).astype(np.uint8)
        out.append({"pixels": arr, "caption": f"a synthetic pattern number {i}", "crop": (0, 0),
                    "orig": (resolution, resolution)})
    return out


def dataset_files(folder: Path) -> list[Path]:
    """Images of the documented layout: any depth of subfolders, hidden files skipped."""
    return sorted(f for f in folder.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_EXTS
                  and not any(part.startswith(".") for part in f.relative_to(folder).parts))


def make_buckets(resolution: int, multiple: int) -> list[tuple[int, int]]:
    """(width, height) pairs, multiples of `multiple`, of about resolution^2 pixels, aspect from 1:4
    to 4:1 -- the same grid each run, so a resumed run buckets every image the same way."""
    area, out = resolution * resolution, []
    w = max(multiple, (resolution // 2) // multiple * multiple)
    while w <= resolution * 2:
        h = (area // w) // multiple * multiple
        if h >= multiple and 0.25 <= w / h <= 4:
            out.append((w, h))
        w += multiple
    return sorted(set(out))


def fit_image(im: Any, size: tuple[int, int]) -> tuple[Any, tuple[int, int], tuple[int, int]]:
    """Resize to cover `size` (w, h), centre-crop. Returns (HWC uint8, crop (top, left) in the
    resized image, original (height, width)) -- SDXL's conditioning wants both."""
    import numpy as np
    from PIL import Image

    im = im.convert("RGB")
    orig = (im.height, im.width)
    tw, th = size
    scale = max(tw / im.width, th / im.height)
    im = im.resize((max(tw, round(im.width * scale)), max(th, round(im.height * scale))),
                   Image.BICUBIC)
    left, top = (im.width - tw) // 2, (im.height - th) // 2
    return np.asarray(im.crop((left, top, left + tw, top + th))), (top, left), orig


def folder_images(folder: Path, resolution: int, default_caption: str,
                  buckets: list[tuple[int, int]] | None = None) -> list[dict[str, Any]]:
    from PIL import Image

    files = dataset_files(folder)
    if not files:
        raise UsageError(f"--data-dir {folder}: no images ({', '.join(sorted(IMAGE_EXTS))})")
    out = []
    for f in files:
        try:
            with Image.open(f) as im:
                size = (resolution, resolution)
                if buckets:
                    aspect = im.width / im.height
                    size = min(buckets, key=lambda b: (abs(math.log(b[0] / b[1] / aspect)), -b[0] * b[1]))
                arr, crop, orig = fit_image(im, size)
        except OSError as exc:
            raise UsageError(f"--data-dir: {f} is not a readable image ({exc})") from None
        cap = f.with_suffix(".txt")
        caption = cap.read_text(encoding="utf-8").strip() if cap.is_file() else default_caption
        out.append({"pixels": arr, "caption": caption or default_caption, "crop": crop,
                    "orig": orig})
    return out


def data_fingerprint(args: argparse.Namespace) -> str:
    if args.data_dir is None:
        return f"synthetic:{args.synthetic}"
    h = hashlib.sha256()
    for f in sorted(args.data_dir.rglob("*")):
        if f.is_file():
            h.update(f"{f.relative_to(args.data_dir)}:{f.stat().st_size}\n".encode())
    return "dir:" + h.hexdigest()[:16]


def batch_indices(step: int, batch_size: int, n: int, seed: int) -> list[int]:
    """Sample positions of global step `step` (1-based): epoch e uses a permutation seeded by
    (seed, e), so the order is a pure function of the step and survives any resume."""
    import torch

    idx = []
    for j in range(batch_size):
        pos = (step - 1) * batch_size + j
        epoch, k = divmod(pos, n)
        g = torch.Generator().manual_seed(step_seed(seed, epoch, "epoch"))
        idx.append(int(torch.randperm(n, generator=g)[k]))
    return idx
