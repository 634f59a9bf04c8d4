"""The tiny SD3-shaped diffusers folder (random weights, built locally: sdcloud_agent/trainers/tiny.py),
written once per test process (per xdist worker) and shared by the sd3 tests, which only read it."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=None)
def tiny_folder(family: str = "sd3") -> Path:
    from sdcloud_agent.trainers import tiny

    root = Path(tempfile.mkdtemp(prefix=f"sdcloud-tiny-{family}-"))
    atexit.register(shutil.rmtree, root, True)
    return tiny.save_pipeline(root / f"my-{family}-model", family=family)
