"""Benchmark: a local folder bucket's listing by prefix (LocalStore.list) against its anchor, a walk
of the whole bucket filtered by the prefix (how the local store listed before), in the same run.

A batch job's workers list the job's done markers on every pass; beside them the bucket holds a
lease and an image per item. The anchor's cost grows with the bucket, the listing's with what it
returns.

    python bench/store_listing.py [--items 2000 5000 10000] [--repeat 5]

One line per size: listing items=<n> objects=<m> anchor_ms=<a> sdcloud_ms=<b> speedup=<a/b>.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bootstrap"))

from sdcloud_agent.store import LocalStore  # noqa: E402


def whole_bucket_walk(root: Path, prefix: str) -> list[str]:
    """The anchor: every object in the bucket, kept when its key starts with the prefix (the store's
    own metadata folder and temporary files, both named with a leading dot, left out)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith("."):
                continue
            p = Path(dirpath) / name
            key = p.relative_to(root).as_posix()
            if key.startswith(prefix):
                out.append((key, p.stat().st_size))
    return sorted(k for k, _ in out)


def fill(root: Path, items: int, done: int) -> None:
    """A job's layout without the store's fsyncs (the bench times reads): leases, images, done markers."""
    for sub in ("leases", "images", "done"):
        (root / "job" / sub).mkdir(parents=True, exist_ok=True)
    for i in range(items):
        (root / "job" / "leases" / f"i{i:06d}.json").write_bytes(b"{}")
        (root / "job" / "images" / f"i{i:06d}.png").write_bytes(b"x")
        if i < done:
            (root / "job" / "done" / f"i{i:06d}.json").write_bytes(b"{}")


def best_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, nargs="+", default=[2000, 5000, 10000])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="a quick form for the test suite: 200 items, once")
    args = ap.parse_args()
    if args.smoke:
        args.items, args.repeat = [200], 1
    for n in args.items:
        with tempfile.TemporaryDirectory(prefix="sdcloud-bench-") as d:
            root = Path(d)
            fill(root, n, n // 10)  # a pass early in the job: a tenth done
            store = LocalStore(root)
            prefix = "job/done/"
            assert [o.key for o in store.list(prefix)] == whole_bucket_walk(root, prefix)
            anchor = best_ms(lambda: whole_bucket_walk(root, prefix), args.repeat)
            ours = best_ms(lambda: store.list(prefix), args.repeat)
            print(f"listing items={n} objects={2 * n + n // 10} anchor_ms={anchor:.1f} sdcloud_ms={ours:.1f} "
                  f"speedup={anchor / ours:.1f}", flush=True)


if __name__ == "__main__":
    main()
