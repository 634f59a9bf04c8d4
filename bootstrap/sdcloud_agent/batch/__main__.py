"""`python -m sdcloud_agent.batch --store JSON --job PREFIX [--worker-id W] [--generator diffusers|fake]`: one worker.

SIGTERM (a reclaim notice relayed by the host, or a stop) finishes or abandons the current batch,
releases the lease and exits 0; the items left are claimed by the other workers.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time

from ..store import open_store
from .worker import Worker


def prepare_job(store, job: dict, cache_dir: str | None = None) -> dict:
    """A job whose LoRA came from a training run (`lora_key`, copied into the job's prefix at submit):
    fetch it once into a local folder and point `lora` at the file, as for `--lora FILE`."""
    if not job.get("lora_key"):
        return job
    import os
    import tempfile

    folder = cache_dir or tempfile.mkdtemp(prefix="sdcloud-lora-")
    path = os.path.join(folder, job["lora_key"].rsplit("/", 1)[-1])
    if not os.path.isfile(path):
        store.get_file(job["lora_key"], path)
    return {**job, "lora_identity": job.get("lora"), "lora": path}


def make_generator(kind: str, job: dict, args: argparse.Namespace):
    if kind == "fake":  # no model: the protocol alone (tests, the scale run)
        import hashlib

        class Fake:
            batch_size = 2

            def generate(self, settings, seeds, abort):
                if args.fake_delay and abort.wait(args.fake_delay):
                    return None
                return [b"FAKEPNG" + hashlib.sha256(json.dumps([settings, s], sort_keys=True).encode()).digest()
                        for s in seeds]
        return Fake()
    from .generate import DiffusersGenerator

    return DiffusersGenerator.from_job(job, compile_unet=args.compile, vae_tiling=args.vae_tiling)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sdcloud_agent.batch")
    ap.add_argument("--store", required=True, help="store config as JSON or a URL")
    ap.add_argument("--job", required=True, help="the job's prefix in the store")
    ap.add_argument("--worker-id")
    ap.add_argument("--generator", default="diffusers", choices=["diffusers", "fake"])
    ap.add_argument("--ttl", type=float, default=60.0)
    ap.add_argument("--fake-delay", type=float, default=0.0)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--vae-tiling", action="store_true")
    args = ap.parse_args(argv)
    conf = json.loads(args.store) if args.store.lstrip().startswith("{") else args.store
    store = open_store(conf)
    job = json.loads(store.get(f"{args.job}/job.json"))
    if args.generator != "fake":
        job = prepare_job(store, job)
    gen = make_generator(args.generator, job, args)
    kw = {"worker_id": args.worker_id} if args.worker_id else {}
    w = Worker(store, args.job, gen, ttl=args.ttl, idle_wait=min(2.0, args.ttl / 4),
               log=lambda m: print(f"{time.strftime('%H:%M:%S')} {m}", file=sys.stderr, flush=True), **kw)
    signal.signal(signal.SIGTERM, lambda *_: w.stop.set())
    stats = w.run()
    print(json.dumps({"worker": w.worker_id, **stats.__dict__}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
