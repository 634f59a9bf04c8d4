"""An external trainer (fake_host.fake_external: the diffusers or kohya DreamBooth shape) that
runs out of GPU memory the way the real scripts print it: from global step FAKE_OOM_AT on, unless
its command line has FAKE_OOM_CURE (a flag, or FLAG=VALUE), it writes the recorded output in
FAKE_OOM_TEXT (tests/data/oom/) to stderr and exits 1.

    python oom_fake.py diffusers|sdxl_train.py --output_dir ... [--gradient_checkpointing]

Each checkpoint also holds optimizer.bin naming the optimizer that saved it (AdamW, AdamW8bit with
--use_8bit_adam, or kohya's --optimizer_type). A resume from a checkpoint of another optimizer
fails at the first step as the real libraries do when accelerate's load_state hands them AdamW's
state: bitsandbytes' update_step reads state["state1"], transformers' Adafactor
state["exp_avg_sq_row"] (KeyError).
"""

from __future__ import annotations

import builtins
import json
import os
import sys
from pathlib import Path

from tests.support import fake_host


def cured(argv: list[str], cure: str) -> bool:
    flag, _, value = cure.partition("=")
    for i, a in enumerate(argv):
        if a == flag and (not value or (i + 1 < len(argv) and argv[i + 1] == value)):
            return True
    return False


# The state key each optimizer reads first, missing from another optimizer's state.
FIRST_KEY = {"AdamW": "exp_avg", "AdamW8bit": "state1", "Adafactor": "exp_avg_sq_row"}


def optimizer(argv: list[str]) -> str:
    if "--use_8bit_adam" in argv:
        return "AdamW8bit"
    if "--optimizer_type" in argv:
        return argv[argv.index("--optimizer_type") + 1]
    return "AdamW"


def resumed_from(kind: str, argv: list[str]) -> Path | None:
    def value(flag: str) -> str | None:
        return argv[argv.index(flag) + 1] if flag in argv else None

    if kind == "diffusers" and value("--resume_from_checkpoint") == "latest":
        found = sorted(Path(value("--output_dir")).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        return found[-1] if found else None
    return Path(value("--resume")) if value("--resume") else None


def main() -> int:
    kind, argv = sys.argv[1], sys.argv[2:]
    opt = optimizer(argv)
    resume = resumed_from(kind, argv)
    loaded = json.loads((resume / "optimizer.bin").read_text())["class"] if resume else None
    save_state = fake_host._save_state

    def saving(d: Path, glob: int, slow: float, extra: dict | None = None) -> None:
        save_state(d, glob, slow, extra=extra)
        (d / "optimizer.bin").write_text(json.dumps({"class": opt}))

    fake_host._save_state = saving
    at = int(os.environ["FAKE_OOM_AT"])
    ok = cured(argv, os.environ["FAKE_OOM_CURE"])
    text = Path(os.environ["FAKE_OOM_TEXT"]).read_text()
    real_print = builtins.print

    def printing(*args, **kw):
        line = " ".join(str(a) for a in args)
        if line.startswith("FAKESTEP ") and loaded not in (None, opt):
            state = dict.fromkeys(("step", "exp_avg", "exp_avg_sq") if loaded == "AdamW" else (FIRST_KEY[loaded],))
            _ = state[FIRST_KEY[opt]]  # the new optimizer's update step on the loaded state: KeyError
        if line.startswith("FAKESTEP ") and int(line.split()[1]) >= at and not ok:
            sys.stderr.write(text)
            sys.stderr.flush()
            raise SystemExit(1)
        real_print(*args, **kw)

    fake_host.print = printing  # the module's own `print` (looked up in its globals first)
    return fake_host.fake_external("diffusers" if kind == "diffusers" else "kohya-db", argv)


if __name__ == "__main__":
    sys.exit(main())
