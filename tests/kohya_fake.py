"""Stands in for kohya sd-scripts' network trainers (train_network.py, sdxl_train_network.py) in
tests: the flags, the dataset rules and the step arithmetic of a resume, not the training.

- `--train_data_dir` must hold `<repeats>_<name>` subfolders; a flat folder of images prints
  "No data found" and exits 0 (as upstream does). `--dataset_config` TOML subsets are read.
- an epoch is ceil(images * repeats / batch_size) steps (one bucket).
- `--resume DIR --skip_until_initial_step`: the step in DIR/train_state.json is reduced by one
  epoch per skipped epoch and becomes the global step (the upstream arithmetic: past the first
  epoch, the step within the epoch); the progress bar spans max_train_steps - that step.
- saves `<output_name>-step<global:08d>-state/` every --save_every_n_steps global steps, then
  `<output_name>.safetensors` at the end. Prints `TRUESTEP n` (steps trained since step 0, what
  the run's global step should be) so a test can check the adapter's numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
import tomllib
from pathlib import Path

IMAGES = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}


def images_in(folder: Path) -> int:
    return sum(1 for f in folder.iterdir() if f.suffix.lower() in IMAGES)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    for flag in ("--output_dir", "--output_name", "--resume", "--dataset_config", "--train_data_dir",
                 "--network_module", "--pretrained_model_name_or_path", "--resolution"):
        p.add_argument(flag)
    for flag in ("--max_train_steps", "--save_every_n_steps", "--train_batch_size"):
        p.add_argument(flag, type=int, default=None)
    p.add_argument("--save_state", action="store_true")
    p.add_argument("--skip_until_initial_step", action="store_true")
    a, _unknown = p.parse_known_args(argv)
    if not a.network_module:
        print("error: network_module is required for network training", file=sys.stderr)
        return 1
    batch = a.train_batch_size or 1
    seen = 0  # images per epoch, repeats counted
    if a.dataset_config:
        cfg = tomllib.loads(Path(a.dataset_config).read_text())
        for ds in cfg["datasets"]:
            batch = int(ds.get("batch_size", batch))
            for sub in ds["subsets"]:
                seen += images_in(Path(sub["image_dir"])) * int(sub.get("num_repeats", 1))
    elif a.train_data_dir:
        for sub in sorted(Path(a.train_data_dir).iterdir()):
            m = re.match(r"^(\d+)_", sub.name)
            if sub.is_dir() and m:
                seen += images_in(sub) * int(m.group(1))
    if not seen:
        print("No data found. Please verify arguments (train_data_dir must be the parent of folders with images)",
              file=sys.stderr, flush=True)
        return 0  # upstream exits without an error code
    per_epoch = math.ceil(seen / batch)
    print(f"num batches per epoch / 1epochのバッチ数: {per_epoch}", file=sys.stderr, flush=True)
    # A bar of another phase: it must not count as training steps.
    sys.stderr.write(f"\rloading captions: 100%|##| {seen}/{seen} [00:00<00:00, 99.00it/s]\n")
    out = Path(a.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    true_step = initial = 0
    if a.resume:
        true_step = int(json.loads((Path(a.resume) / "train_state.json").read_text())["current_step"])
        if a.skip_until_initial_step:
            initial = true_step
    global_step = 0
    if initial > 0:
        for _ in range(initial // per_epoch):  # upstream: skip whole epochs
            initial -= per_epoch
        global_step = initial
    total = a.max_train_steps - global_step
    step_s = float(os.environ.get("FAKE_STEP_SECONDS", "0.05"))
    t0, k = time.time(), 0
    while global_step < a.max_train_steps:
        time.sleep(step_s)
        global_step += 1
        true_step += 1
        k += 1
        print(f"TRUESTEP {true_step}", flush=True)
        sys.stderr.write(f"\rsteps: {100 * k // total}%|##| {k}/{total} "
                         f"[00:01<00:01, {k / (time.time() - t0):.2f}it/s, avr_loss=0.1]")
        sys.stderr.flush()
        if a.save_state and a.save_every_n_steps and global_step % a.save_every_n_steps == 0:
            d = out / f"{a.output_name}-step{global_step:08d}-state"
            d.mkdir()
            (d / "model.safetensors").write_bytes(b"w" * 1000)
            (d / "train_state.json").write_text(json.dumps({"current_epoch": 1 + (true_step - 1) // per_epoch,
                                                            "current_step": true_step}))
            (d / "random_states_0.pkl").write_bytes(b"rng")
    (out / f"{a.output_name}.safetensors").write_bytes(b"lora")
    print("\nmodel saved.", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[2:] if len(sys.argv) > 1 and sys.argv[1].endswith(".py") else sys.argv[1:]))
