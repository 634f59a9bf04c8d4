"""Benchmark: batch generation on CPU with the tiny SD1.5-shaped pipeline, through sdcloud's batch
worker (leases, create-only images, done markers, index) against a plain diffusers loop over the
same prompts, seeds and batch size, in the same process. The difference is the coordination overhead.

    python bench/batch.py [--prompts 12] [--count 2] [--steps 4] [--size 64] [--store local|seaweed]

The last line is: batch images=<n> plain_ips=<x> sdcloud_ips=<y> overhead_pct=<z> store=<s>
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
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bootstrap"))
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--count", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--store", choices=["local", "seaweed"], default="local")
    args = ap.parse_args()

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

    # The plain loop: the same pipeline, prompts, seeds and batch size; images kept in memory.
    abort = threading.Event()
    t0 = time.perf_counter()
    made = 0
    for it in items:
        seeds = it["seeds"]
        for k in range(0, len(seeds), gen.batch_size):
            made += len(gen.generate(it["settings"], seeds[k:k + gen.batch_size], abort))
    plain_s = time.perf_counter() - t0

    server = None
    if args.store == "seaweed":
        import os

        import boto3
        from servers import SeaweedS3

        server = SeaweedS3().start()
        os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret",
                           "AWS_DEFAULT_REGION": "us-east-1", "AWS_CA_BUNDLE": str(server.ca_file)})
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        boto3.client("s3", endpoint_url=server.endpoint).create_bucket(Bucket=bucket)
        store = open_store({"url": f"s3://{bucket}/b", "endpoint_url": server.endpoint})
    else:
        store = LocalStore(Path(tempfile.mkdtemp(prefix="sdcloud-bench-batch-")) / "bucket")
    try:
        write_job(store, "batch/bench", {"tier": "batch-sd15", "model": "tiny"}, items)
        t0 = time.perf_counter()
        stats = Worker(store, "batch/bench", gen, idle_wait=0.05).run()
        batch_s = time.perf_counter() - t0
        v = verify(store, "batch/bench")
        assert v.ok and stats.images_made == n_images == made, (v.as_dict(), stats)
    finally:
        if server:
            server.stop()
    plain_ips, batch_ips = made / plain_s, n_images / batch_s
    overhead = (batch_s / plain_s - 1) * 100
    print(f"plain diffusers loop: {made} images in {plain_s:.2f} s")
    print(f"sdcloud batch worker: {n_images} images in {batch_s:.2f} s (verify ok)")
    print(f"batch images={n_images} plain_ips={plain_ips:.3f} sdcloud_ips={batch_ips:.3f} "
          f"overhead_pct={overhead:.1f} store={args.store}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
