"""Staging: copy the dataset from the bucket to local NVMe with parallel downloads."""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from .store import ObjectStore, dialects, open_store, retry

log = logging.getLogger("sdcloud_agent.staging")


@dataclass
class StageResult:
    path: Path
    files: int
    bytes: int
    seconds: float
    skipped: int = 0

    @property
    def mbps(self) -> float:
        return self.bytes / 1e6 / max(self.seconds, 1e-9)


def is_remote(spec: str) -> bool:
    return dialects.is_remote(urlparse(spec).scheme)


def stage(spec: str, dest: Path, store_opts: dict | None = None, workers: int = 16,
          store: ObjectStore | None = None) -> StageResult:
    """Download every object under a store URL into `dest` (a local path is used in place).

    Files already present with the right size are kept, so an agent restart does not restage."""
    if not is_remote(spec):
        path = Path(spec).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"dataset {spec} does not exist")
        log.info("dataset is local: %s", path)
        return StageResult(path, 0, 0, 0.0)
    src = store or open_store({"url": spec, **(store_opts or {})})
    objs = src.list("")
    dest.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    todo = []
    skipped = 0
    for o in objs:
        target = dest / o.key
        if target.is_file() and target.stat().st_size == o.size:
            skipped += 1
        else:
            todo.append(o)

    def fetch(o) -> int:
        retry(lambda: src.get_file(o.key, dest / o.key), what=f"download of {o.key}", log=log.warning)
        return o.size

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        total = sum(pool.map(fetch, todo))
    res = StageResult(dest, len(todo), total, time.monotonic() - t0, skipped)
    log.info("staged dataset: %d files, %.1f MB in %.2fs (%.1f MB/s), %d already present",
             res.files, res.bytes / 1e6, res.seconds, res.mbps, skipped)
    return res


def disk_free_gb(path: Path) -> float:
    try:
        st = os.statvfs(path)
        return round(st.f_bavail * st.f_frsize / 1e9, 2)
    except OSError:
        return 0.0
