"""Benchmark: batch generation on CPU with the tiny SD1.5-shaped pipeline, through sdcloud's batch
worker (leases, create-only images, done markers, index) against a plain diffusers loop over the
same prompts, seeds and batch size, in the same process. The difference is the coordination overhead.

    python bench/batch.py [--prompts 12] [--count 2] [--steps 4] [--size 64] [--store local|seaweed]

The last line is: batch images=<n> plain_ips=<x> sdcloud_ips=<y> overhead_pct=<z> coordination_s=<c>
coordination_pct=<p> store=<s>. overhead_pct compares wall times of the two loops (noisy on a shared
machine); coordination_pct is the worker's own time outside the generator over its generation time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bootstrap")]  # the tests' helpers, as the tests import them


class Timed:
    """The generator, with the seconds spent inside it counted."""

    def __init__(self, gen):
        self.gen, self.seconds = gen, 0.0
        self.batch_size = gen.batch_size

    def generate(self, settings, seeds, abort):
        t0 = time.perf_counter()
        try:
            return self.gen.generate(settings, seeds, abort)
        finally:
            self.seconds += time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--count", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--store", choices=["local", "seaweed"], default=None, help="local (default; --smoke: seaweed)")
    ap.add_argument("--rounds", type=int, default=2, help="alternate plain and batch; the best of each counts")
    ap.add_argument("--smoke", action="store_true", help="a quick form for the test suite: 2 images, 1 step, SeaweedFS")
    args = ap.parse_args()
    if args.smoke:
        args.prompts, args.count, args.steps, args.size, args.rounds = 2, 1, 1, 64, 1
        args.store = args.store or "seaweed"  # the store start is what broke when the helpers moved
    args.store = args.store or "local"

    from sdcloud.batch.prompts import Prompt, build_items
    from sdcloud_agent.batch.generate import DiffusersGenerator
    from sdcloud_agent.batch.verify import verify
    from sdcloud_agent.batch.worker import Worker, write_job
    from sdcloud_agent.store import LocalStore, open_store

    prompts = [Prompt(n + 1, f"a studio photo of product {n}", "", 1000 * n, args.count, args.size, args.size,
                      args.steps, 5.0, "ddim") for n in range(args.prompts)]
    items = build_items(prompts, "tiny", None)
    n_images = sum(len(it["seeds"]) for it in items)
    gen = DiffusersGenerator.from_job({"model": "tiny", "tier": "batch-sd15"})
    gen.generate(items[0]["settings"], items[0]["seeds"][:1], threading.Event())  # warm-up

    def plain_loop() -> tuple[float, int]:
        # The same pipeline, prompts, seeds and batch size; images kept in memory.
        abort = threading.Event()
        t0 = time.perf_counter()
        made = 0
        for it in items:
            seeds = it["seeds"]
            for k in range(0, len(seeds), gen.batch_size):
                made += len(gen.generate(it["settings"], seeds[k:k + gen.batch_size], abort))
        return time.perf_counter() - t0, made

    server = None
    if args.store == "seaweed":
        import os

        import boto3
        from tests.support.server_seaweed import TEST_KEYS, SeaweedS3

        server = SeaweedS3().start()

        key_id, secret = next(iter(TEST_KEYS.items()))
        os.environ.update({"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret,
                           "AWS_DEFAULT_REGION": "us-east-1", "AWS_CA_BUNDLE": str(server.ca_file)})
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        boto3.client("s3", endpoint_url=server.endpoint).create_bucket(Bucket=bucket)
        store = open_store({"url": f"s3://{bucket}/b", "endpoint_url": server.endpoint})
    else:
        store = LocalStore(Path(tempfile.mkdtemp(prefix="sdcloud-bench-batch-")) / "bucket")
    plain_times, batch_times, coord_times = [], [], []
    try:
        for r in range(args.rounds):
            t, made = plain_loop()
            plain_times.append(t)
            prefix = f"batch/bench-{r}"
            write_job(store, prefix, {"tier": "batch-sd15", "model": "tiny"}, items)
            timed = Timed(gen)
            t0 = time.perf_counter()
            stats = Worker(store, prefix, timed, idle_wait=0.05).run()
            batch_times.append(time.perf_counter() - t0)
            coord_times.append(batch_times[-1] - timed.seconds)
            v = verify(store, prefix)
            assert v.ok and stats.images_made == n_images == made, (v.as_dict(), stats)
    finally:
        if server:
            server.stop()
    plain_s, batch_s = min(plain_times), min(batch_times)
    plain_ips, batch_ips = made / plain_s, n_images / batch_s
    overhead = (batch_s / plain_s - 1) * 100
    # Robust to a noisy machine: the worker's own time outside the generator (leases, writes, index).
    coord_s = min(coord_times)
    coord_pct = coord_s / (batch_times[coord_times.index(coord_s)] - coord_s) * 100
    print(f"plain diffusers loop: {made} images in {plain_s:.2f} s")
    print(f"sdcloud batch worker: {n_images} images in {batch_s:.2f} s (verify ok)")
    print(f"batch images={n_images} plain_ips={plain_ips:.3f} sdcloud_ips={batch_ips:.3f} "
          f"overhead_pct={overhead:.1f} coordination_s={coord_s:.3f} coordination_pct={coord_pct:.2f} store={args.store}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
