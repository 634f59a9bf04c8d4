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
- trains a small LoRA tensor with a deterministic gradient through the optimizer the flags choose
  (--optimizer_type AdamW | AdamW8bit | Adafactor, --use_8bit_adam): each keeps its state under
  the names its library uses (torch AdamW exp_avg/exp_avg_sq, bitsandbytes state1/state2,
  transformers Adafactor exp_avg_sq_row/exp_avg_sq_col) and reads them at each step, so a --resume
  that loads another optimizer's state fails with the same KeyError as the real libraries.
  The state folder holds model.safetensors (the network's tensors, "module."-prefixed when
  FAKE_DDP=1, as accelerate's save_state writes them under DDP) and optimizer.bin.
- `--network_weights FILE` loads the tensor non-strictly (a missing name is reported and left at
  its initial value, as kohya's load_weights does); `--initial_step N` stands in for the state's
  step in the same arithmetic as a resume.
- `--sample_prompts FILE --sample_every_n_steps N`: as upstream's sample_images (library/train_util.py),
  every N global steps, before that step's save, each prompt line (with its `--d SEED`) becomes
  `<output_dir>/sample/<output_name>_<step:06d>_<NN:02d>_<YYYYmmddHHMMSS>_<seed>.png`: a real PNG whose
  colour follows the weights and the seed. `--log_with tensorboard --logging_dir DIR`: the loss as a
  TensorBoard scalar in DIR/<timestamp>/network_train/ (through tensorboardX, as accelerate's tracker);
  `--log_with wandb|all` without WANDB_API_KEY in its environment stops as wandb.init does without a tty.
- every save also writes the LoRA of that step, `<output_name>-step<global:08d>.safetensors`, beside
  the state folder (upstream's get_step_ckpt_name), before the state.
- FAKE_OOM_AT / FAKE_OOM_CURE / FAKE_OOM_TEXT: from that true step on, unless the command line has
  the cure flag, the recorded CUDA out-of-memory output is written to stderr and it exits 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import struct
import sys
import time
import tomllib
from pathlib import Path

IMAGES = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}


def images_in(folder: Path) -> int:
    return sum(1 for f in folder.iterdir() if f.suffix.lower() in IMAGES)


KEY = "lora_unet_fake.lora_down.weight"
LR = 0.05


def save_tensor(path: Path, key: str, values: list[float]) -> None:
    """A real .safetensors file (8-byte header length, JSON header, F32 little-endian bytes)."""
    data = struct.pack(f"<{len(values)}f", *values)
    header = json.dumps({key: {"dtype": "F32", "shape": [len(values)], "data_offsets": [0, len(data)]}}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def load_tensors(path: Path) -> dict[str, list[float]]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for k, v in header.items():
        if k != "__metadata__":
            a, b = v["data_offsets"]
            out[k] = list(struct.unpack(f"<{(b - a) // 4}f", raw[8 + n + a:8 + n + b]))
    return out


def write_png(path: Path, rgb: tuple[int, int, int], side: int = 8) -> None:
    """A real PNG (signature, IHDR, IDAT, IEND) of one colour, in the standard library only."""
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + bytes(rgb) * side for _ in range(side))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def sample_prompts(path: Path) -> list[tuple[str, int | None]]:
    """(prompt, seed) per line of a kohya prompt file: the text before the first ` --`, `--d SEED`."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = re.search(r"--d (\d+)", line)
        out.append((line.split(" --")[0], int(m.group(1)) if m else None))
    return out


def sample_images(a: argparse.Namespace, step: int, w: list[float]) -> None:
    if not (a.sample_prompts and a.sample_every_n_steps) or step % a.sample_every_n_steps:
        return
    folder = Path(a.output_dir) / "sample"
    folder.mkdir(parents=True, exist_ok=True)
    ts = time.strftime("%Y%m%d%H%M%S", time.localtime())
    for i, (_prompt, seed) in enumerate(sample_prompts(Path(a.sample_prompts))):
        rgb = tuple(int(abs(x) * 997 + (seed or 0) * 31 + i * 50) % 256 for x in w[:3])
        suffix = "" if seed is None else f"_{seed}"
        write_png(folder / f"{a.output_name}_{step:06d}_{i:02d}_{ts}{suffix}.png", rgb)


def optimizer_name(a: argparse.Namespace) -> str:
    if a.use_8bit_adam:
        return "AdamW8bit"
    return a.optimizer_type or "AdamW"


def update(opt: str, state: dict, w: list[float], g: list[float]) -> None:
    """One optimizer step; reads the state under the optimizer's own names (a KeyError when the
    state came from another optimizer, as bitsandbytes' update_step and Adafactor's step do)."""
    if not state:  # what each library does on a parameter without state: initialise its own names
        zeros = [0.0] * len(w)
        state.update({"AdamW": {"step": 0, "exp_avg": zeros, "exp_avg_sq": zeros},
                      "AdamW8bit": {"step": 0, "state1": zeros, "state2": zeros},
                      "Adafactor": {"step": 0, "exp_avg_sq_row": zeros, "exp_avg_sq_col": zeros}}[opt])
    state["step"] += 1
    k = state["step"]
    if opt in ("AdamW", "AdamW8bit"):
        m_key, v_key = ("exp_avg", "exp_avg_sq") if opt == "AdamW" else ("state1", "state2")
        m = [0.9 * mi + 0.1 * gi for mi, gi in zip(state[m_key], g)]
        v = [0.999 * vi + 0.001 * gi * gi for vi, gi in zip(state[v_key], g)]
        if opt == "AdamW8bit":  # the 8-bit state's quantisation, coarsely
            m = [round(x, 3) for x in m]
        state[m_key], state[v_key] = m, v
        for i in range(len(w)):
            mh, vh = m[i] / (1 - 0.9 ** k), v[i] / (1 - 0.999 ** k)
            w[i] -= LR * mh / (vh ** 0.5 + 1e-8)
    else:
        row = [0.99 * r + 0.01 * gi * gi for r, gi in zip(state["exp_avg_sq_row"], g)]
        state["exp_avg_sq_row"], state["exp_avg_sq_col"] = row, state["exp_avg_sq_col"]
        for i in range(len(w)):
            w[i] -= LR * g[i] / ((row[i] / (1 - 0.99 ** k)) ** 0.5 + 1e-6)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    for flag in ("--output_dir", "--output_name", "--resume", "--dataset_config", "--train_data_dir",
                 "--network_module", "--pretrained_model_name_or_path", "--resolution", "--optimizer_type",
                 "--network_weights", "--sample_prompts", "--sample_sampler", "--log_with", "--logging_dir"):
        p.add_argument(flag)
    for flag in ("--max_train_steps", "--save_every_n_steps", "--train_batch_size", "--initial_step",
                 "--sample_every_n_steps"):
        p.add_argument(flag, type=int, default=None)
    p.add_argument("--save_state", action="store_true")
    p.add_argument("--skip_until_initial_step", action="store_true")
    p.add_argument("--use_8bit_adam", action="store_true")
    p.add_argument("--optimizer_args", nargs="*")
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
    opt = optimizer_name(a)
    w, opt_state = [0.1, 0.2, 0.3, 0.4], {}
    if a.network_weights:
        loaded = load_tensors(Path(a.network_weights))
        if KEY in loaded:
            w = loaded[KEY]
        print(f"load network weights from {a.network_weights}: missing keys {[k for k in [KEY] if k not in loaded]}, "
              f"unexpected keys {[k for k in loaded if k != KEY]}", file=sys.stderr, flush=True)
    if a.resume:
        true_step = int(json.loads((Path(a.resume) / "train_state.json").read_text())["current_step"])
        # accelerate's load_state: the model's tensors, then the optimizer's state as saved.
        w = next(iter(load_tensors(Path(a.resume) / "model.safetensors").values()))
        opt_state = json.loads((Path(a.resume) / "optimizer.bin").read_text())["state"]
        if a.skip_until_initial_step and a.initial_step is None:
            initial = true_step
    if a.initial_step is not None:
        true_step = a.initial_step  # kohya: initial_step overrides the state's step
        if a.skip_until_initial_step:
            initial = true_step
    oom_at = int(os.environ.get("FAKE_OOM_AT") or 0)
    cure = os.environ.get("FAKE_OOM_CURE", "")
    cured = not oom_at or (cure and cure in argv)
    global_step = 0
    if initial > 0:
        for _ in range(initial // per_epoch):  # upstream: skip whole epochs
            initial -= per_epoch
        global_step = initial
    total = a.max_train_steps - global_step
    step_s = float(os.environ.get("FAKE_STEP_SECONDS", "0.05"))
    writer = None
    if a.log_with in ("wandb", "all") and not os.environ.get("WANDB_API_KEY"):
        # wandb.init without a key and without a terminal to ask on: upstream stops there.
        print("wandb.errors.UsageError: api_key not configured (no-tty). call wandb.login(key=[your_api_key])",
              file=sys.stderr, flush=True)
        return 1
    if a.log_with in ("tensorboard", "all") and a.logging_dir:
        from tensorboardX import SummaryWriter

        writer = SummaryWriter(str(Path(a.logging_dir) / time.strftime("%Y%m%d%H%M%S") / "network_train"))
    t0, k = time.time(), 0
    while global_step < a.max_train_steps:
        time.sleep(step_s)
        if not cured and true_step + 1 >= oom_at:
            sys.stderr.write(Path(os.environ["FAKE_OOM_TEXT"]).read_text())
            sys.stderr.flush()
            return 1
        global_step += 1
        true_step += 1
        update(opt, opt_state, w, [wi - 0.05 * ((true_step * (i + 3)) % 7) for i, wi in enumerate(w)])
        k += 1
        print(f"TRUESTEP {true_step}", flush=True)
        sys.stderr.write(f"\rsteps: {100 * k // total}%|##| {k}/{total} "
                         f"[00:01<00:01, {k / (time.time() - t0):.2f}it/s, avr_loss=0.1]")
        sys.stderr.flush()
        if writer is not None:
            writer.add_scalar("loss/current", 0.1, global_step)
            writer.flush()
        sample_images(a, global_step, w)
        if a.save_state and a.save_every_n_steps and global_step % a.save_every_n_steps == 0:
            save_tensor(out / f"{a.output_name}-step{global_step:08d}.safetensors", KEY, w)
            d = out / f"{a.output_name}-step{global_step:08d}-state"
            d.mkdir()
            prefix = "module." if os.environ.get("FAKE_DDP") == "1" else ""
            save_tensor(d / "model.safetensors", prefix + KEY, w)
            (d / "optimizer.bin").write_text(json.dumps({"class": opt, "state": opt_state}))
            (d / "train_state.json").write_text(json.dumps({"current_epoch": 1 + (true_step - 1) // per_epoch,
                                                            "current_step": true_step}))
            (d / "random_states_0.pkl").write_bytes(b"rng")
    save_tensor(out / f"{a.output_name}.safetensors", KEY, w)
    if writer is not None:
        writer.close()
    print("\nmodel saved.", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[2:] if len(sys.argv) > 1 and sys.argv[1].endswith(".py") else sys.argv[1:]))
