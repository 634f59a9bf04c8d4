"""An external trainer (agent_fakes.fake_external: the diffusers or kohya DreamBooth shape) that
runs out of GPU memory the way the real scripts print it: from global step FAKE_OOM_AT on, unless
its command line has FAKE_OOM_CURE (a flag, or FLAG=VALUE), it writes the recorded output in
FAKE_OOM_TEXT (tests/data/oom/) to stderr and exits 1.

    python oom_fake.py diffusers|sdxl_train.py --output_dir ... [--gradient_checkpointing]
"""

from __future__ import annotations

import builtins
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import agent_fakes  # noqa: E402


def cured(argv: list[str], cure: str) -> bool:
    flag, _, value = cure.partition("=")
    for i, a in enumerate(argv):
        if a == flag and (not value or (i + 1 < len(argv) and argv[i + 1] == value)):
            return True
    return False


def main() -> int:
    kind, argv = sys.argv[1], sys.argv[2:]
    at = int(os.environ["FAKE_OOM_AT"])
    ok = cured(argv, os.environ["FAKE_OOM_CURE"])
    text = Path(os.environ["FAKE_OOM_TEXT"]).read_text()
    real_print = builtins.print

    def printing(*args, **kw):
        line = " ".join(str(a) for a in args)
        if line.startswith("FAKESTEP ") and int(line.split()[1]) >= at and not ok:
            sys.stderr.write(text)
            sys.stderr.flush()
            raise SystemExit(1)
        real_print(*args, **kw)

    agent_fakes.print = printing  # the module's own `print` (looked up in its globals first)
    return agent_fakes.fake_external("diffusers" if kind == "diffusers" else "kohya-db", argv)


if __name__ == "__main__":
    sys.exit(main())
