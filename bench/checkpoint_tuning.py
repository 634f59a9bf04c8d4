"""Tuning: the agent's checkpoint upload and restore over part sizes and concurrency.

    python bench/checkpoint_tuning.py [--size-mb 1000] [--parts 8,16] [--workers 10,16] [--io-kib 256,1024,4096]

Against SeaweedFS on loopback, one checkpoint folder shaped like bench/checkpoint_sync.py's; each
setting uploads it as a new step (sha256 and manifest included) and restores it (verified), and
s5cmd's upload and download run between settings as the yardstick for the machine's drifting
load. One line per setting: `tune agent part_mib=<p> workers=<w> io_kib=<i> up_MBps=<x> down_MBps=<y>` (io_kib: the size of
the writes the restore hands to the hashing writer).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT), str(ROOT.parent), str(ROOT.parent / "bootstrap")]  # its neighbour, the tests' helpers

from checkpoint_sync import MB, make_checkpoint  # noqa: E402
from tests.support.server_seaweed import TEST_KEYS, SeaweedS3  # noqa: E402

from sdcloud_agent import manifest as mf  # noqa: E402
from sdcloud_agent import transfer  # noqa: E402
from sdcloud_agent.store import open_store  # noqa: E402
from sdcloud_agent.sync import CheckpointSync  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=1000)
    ap.add_argument("--parts", default="8,16", help="part sizes in MiB")
    ap.add_argument("--workers", default="10,16")
    ap.add_argument("--io-kib", default="1024", help="restore write sizes in KiB")
    ap.add_argument("--smoke", action="store_true", help="a quick form for the test suite: 4 MB, one setting")
    args = ap.parse_args()
    if args.smoke:
        args.size_mb, args.parts, args.workers = 4, "8", "4"
    work = Path(tempfile.mkdtemp(prefix="sdcloud-tune-"))
    server = SeaweedS3().start(timeout=180)
    key_id, secret = next(iter(TEST_KEYS.items()))  # the keys the server knows; its certificate trusted as production's
    env = {**os.environ, "AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret,
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CA_BUNDLE": str(server.ca_file), "SSL_CERT_FILE": str(server.ca_file)}
    os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                                           "AWS_EC2_METADATA_DISABLED", "AWS_CA_BUNDLE")})
    try:
        import boto3
        bucket = f"tune-{uuid.uuid4().hex[:8]}"
        boto3.client("s3", endpoint_url=server.endpoint).create_bucket(Bucket=bucket)
        a = make_checkpoint(work / "step-000000100", args.size_mb)
        nbytes = sum(p.stat().st_size for p in a.iterdir())
        s5 = shutil.which("s5cmd")

        def s5cmd() -> None:
            if not s5:
                return
            t0 = time.monotonic()
            subprocess.run([s5, "--endpoint-url", server.endpoint, "cp", f"{a}/*", f"s3://{bucket}/s5/"], env=env,
                           check=True, stdout=subprocess.DEVNULL)
            up = time.monotonic() - t0
            t0 = time.monotonic()
            subprocess.run([s5, "--endpoint-url", server.endpoint, "cp", f"s3://{bucket}/s5/*", f"{work}/s5/"],
                           env=env, check=True, stdout=subprocess.DEVNULL)
            down = time.monotonic() - t0
            shutil.rmtree(work / "s5", ignore_errors=True)
            print(f"tune s5cmd up_MBps={nbytes / MB / up:.1f} down_MBps={nbytes / MB / down:.1f}", flush=True)

        step = 0
        for part in (int(p) for p in args.parts.split(",")):
            s5cmd()
            for workers, io_kib in ((int(w), int(i)) for w in args.workers.split(",") for i in args.io_kib.split(",")):
                transfer.IO_CHUNK = io_kib * 1024
                step += 1
                store = open_store({"url": f"s3://{bucket}/agent", "endpoint_url": server.endpoint},
                                   part_size=part * 2**20, workers=workers)
                sync = CheckpointSync(store, "runs/tune", keep=1000)  # no pruning inside the timing
                t0 = time.monotonic()
                sync.upload(a, step)
                up = time.monotonic() - t0
                m = mf.read(store, "runs/tune", step)
                t0 = time.monotonic()
                mf.download(store, "runs/tune", m, work / "restore" / m.name)
                down = time.monotonic() - t0
                shutil.rmtree(work / "restore", ignore_errors=True)
                mf.delete_checkpoint(store, "runs/tune", step)
                print(f"tune agent part_mib={part} workers={workers} io_kib={io_kib} up_MBps={nbytes / MB / up:.1f} "
                      f"down_MBps={nbytes / MB / down:.1f}", flush=True)
        s5cmd()
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
