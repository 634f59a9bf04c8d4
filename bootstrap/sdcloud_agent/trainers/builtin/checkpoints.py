"""Checkpoint folders: listing and resuming (no torch), and the trainer's save, prune and load of
`step-<n>/` (weights, optimizer, schedule, RNG, trainer_state.json last), built in a temp folder
and renamed into place whole.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

from .data import data_fingerprint
from .distributed import DIST
from .protocol import SAVE_PAUSE_ENV, UsageError, emit, log


CHECKPOINT_RE = re.compile(r"^step-(\d{9})$")


TMP_PREFIX = ".tmp-step-"


STATE_FILE = "trainer_state.json"


EXPORT = "export"  # in a LoRA checkpoint: the LoRA files and README of that step, as the final output has them


def list_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints in folder, oldest first. ``.tmp-*`` folders never count."""
    found = []
    if folder.is_dir():
        for child in folder.iterdir():
            m = CHECKPOINT_RE.match(child.name)
            if m and (child / STATE_FILE).is_file():
                found.append((int(m.group(1)), child))
    return sorted(found)


def resolve_resume(arg: str | None, checkpoint_dir: Path) -> Path | None:
    if not arg:
        return None
    if arg == "latest":
        ckpts = list_checkpoints(checkpoint_dir)
        return ckpts[-1][1] if ckpts else None
    path = Path(arg)
    if (path / STATE_FILE).is_file():
        return path
    ckpts = list_checkpoints(path)
    if ckpts:
        return ckpts[-1][1]
    raise UsageError(f"--resume-from {arg}: not a complete checkpoint nor a folder holding one")


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_tmp(checkpoint_dir: Path) -> None:
    """Half-written checkpoints of a killed earlier process: we are the only writer here."""
    if checkpoint_dir.is_dir():
        for child in checkpoint_dir.iterdir():
            if child.name.startswith((TMP_PREFIX, ".old-step-")) and child.is_dir():
                shutil.rmtree(child, ignore_errors=True)


class CheckpointIO:
    def _weights(self) -> dict[str, Any]:
        if self.args.mode == "lora":
            from peft.utils import get_peft_model_state_dict

            sd = get_peft_model_state_dict(self.unet)
        else:
            sd = self.unet.state_dict()
        return {k: v.detach().to("cpu").contiguous() for k, v in sd.items()}

    def _config_record(self) -> dict[str, Any]:
        a = self.args
        return {"mode": a.mode, "rank": a.rank if a.mode == "lora" else None, "model": a.model,
                "family": self.family, "seed": a.seed, "resolution": a.resolution,
                "batch_size": a.batch_size, "grad_accum": a.grad_accum, "optimizer": a.optimizer,
                "world_size": DIST.world,
                "data": data_fingerprint(a)}

    def save_checkpoint(self) -> Path:
        root = self.args.checkpoint_dir
        final = root / f"step-{self.global_step:09d}"
        if DIST.rank == 0:
            self._save_checkpoint()
        DIST.barrier()  # the others go on once the folder is complete
        return final

    def _save_checkpoint(self) -> Path:
        import numpy as np
        from safetensors.torch import save_file

        torch, step = self.torch, self.global_step
        save_t0 = time.monotonic()
        root = self.args.checkpoint_dir
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"step-{step:09d}"
        tmp = root / f"{TMP_PREFIX}{step:09d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        weights = "lora.safetensors" if self.args.mode == "lora" else "unet.safetensors"
        save_file(self._weights(), str(tmp / weights), metadata={"global_step": str(step)})
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(self.lr_scheduler.state_dict(), tmp / "scheduler.pt")
        if self.scaler is not None:
            torch.save(self.scaler.state_dict(), tmp / "scaler.pt")
        np_state = np.random.get_state()
        py_state = random.getstate()
        (tmp / "rng.json").write_text(json.dumps({
            "python": [py_state[0], list(py_state[1]), py_state[2]],
            "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]]}))
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            for i, s in enumerate(torch.cuda.get_rng_state_all()):
                rng[f"cuda_{i}"] = s
        save_file(rng, str(tmp / "rng.safetensors"))
        sample_t0 = time.monotonic()
        self._validation_images(tmp)
        sample_s = time.monotonic() - sample_t0  # the samples' GPU seconds: sampling, not saving (the cost report)
        if self.args.mode == "lora":  # the model at this step as the final one is: `sdcloud pull --step N`
            self.write_output(tmp / EXPORT)
        pause = float(os.environ.get(SAVE_PAUSE_ENV) or 0)
        if pause:
            time.sleep(pause)
        files = {f.name: f.stat().st_size for f in sorted(tmp.iterdir()) if f.is_file()}
        state = {"global_step": step, "total_steps": self.args.steps, **self._config_record(),
                 "mixed_precision": self.mixed_precision, "weights": weights, "files": files,
                 "time": time.time()}
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
        for f in tmp.rglob("*"):
            _fsync_path(f)
        _fsync_path(tmp)
        if final.exists():  # re-saving a step (resumed from an older one): swap, then drop
            old = root / f".old-step-{step:09d}-{os.getpid()}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_path(root)
        emit("CHECKPOINT", {"step": step, "path": str(final.resolve()),
                            "save_s": round(time.monotonic() - save_t0 - sample_s, 3), "sample_s": round(sample_s, 3)})
        self._prune()
        return final

    def _prune(self) -> None:
        keep = self.args.keep_checkpoints
        if keep:
            for _, path in list_checkpoints(self.args.checkpoint_dir)[:-keep]:
                # Rename first so a reader never sees a step-* folder being emptied.
                doomed = path.with_name(f".old-{path.name}-{os.getpid()}")
                os.rename(path, doomed)
                shutil.rmtree(doomed, ignore_errors=True)

    def load_checkpoint(self, path: Path) -> None:
        import numpy as np
        from safetensors.torch import load_file

        torch = self.torch
        state = json.loads((path / STATE_FILE).read_text())
        mine = self._config_record()
        fresh_optimizer = False
        for key in ("mode", "rank", "family", "optimizer"):
            if key == "optimizer" and state.get(key) != mine[key] and self.args.optimizer_change:
                log(f"optimizer {state.get(key)} -> {mine[key]}: its state starts afresh at step "
                    f"{state.get('global_step')}")
                fresh_optimizer = True
                continue
            if state.get(key) != mine[key]:
                raise UsageError(f"checkpoint {path} has {key}={state.get(key)!r}, "
                                 f"this run {mine[key]!r}")
        for key in ("seed", "batch_size", "grad_accum", "world_size", "resolution", "data", "model"):
            if state.get(key) != mine[key]:
                log(f"warning: checkpoint {key}={state.get(key)!r} differs from {mine[key]!r}; "
                    "the run will not match an uninterrupted one")
        weights = load_file(str(path / state["weights"]), device=str(self.device))
        if self.args.mode == "lora":
            from peft.utils import set_peft_model_state_dict

            res = set_peft_model_state_dict(self.unet, weights)
            if getattr(res, "unexpected_keys", None):
                raise UsageError(f"checkpoint {path}: unexpected LoRA keys {res.unexpected_keys[:3]}")
        else:
            self.unet.load_state_dict(weights)
        for p in self.params:
            p.data = p.data.float()
        if not fresh_optimizer:
            self.optimizer.load_state_dict(
                torch.load(path / "optimizer.pt", map_location=self.device, weights_only=True))
        self.lr_scheduler.load_state_dict(
            torch.load(path / "scheduler.pt", weights_only=True))
        if self.scaler is not None and (path / "scaler.pt").is_file():
            self.scaler.load_state_dict(torch.load(path / "scaler.pt", weights_only=True))
        rj = json.loads((path / "rng.json").read_text())
        random.setstate((rj["python"][0], tuple(rj["python"][1]), rj["python"][2]))
        n = rj["numpy"]
        np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), *n[2:]))
        rng = load_file(str(path / "rng.safetensors"))
        torch.set_rng_state(rng["torch"])
        if torch.cuda.is_available():
            cuda = [rng[f"cuda_{i}"] for i in range(torch.cuda.device_count()) if f"cuda_{i}" in rng]
            if len(cuda) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(cuda)
        self.global_step = int(state["global_step"])
