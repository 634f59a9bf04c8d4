"""Benchmark: checkpoint upload and restore against SeaweedFS on loopback, the agent vs awscli,
s5cmd and boto3's TransferManager.

    python bench/checkpoint_sync.py [--sizes 1000] [--workdir DIR] [--part-mib N] [--workers N]

For each checkpoint folder size (MB), on the same folder and server, in one run:
  - upload MB/s: the agent (CheckpointSync.upload: sha256 of every byte from the upload's own
    reads, parallel files and parts, manifest last), `aws s3 sync`, `s5cmd cp` and boto3's
    TransferManager with its defaults (no manifest, no sha256 of their own);
  - restore MB/s of the same folder: the agent (manifest.download on a fresh store: parallel
    ranged GETs read straight into the files, each checked against its block checksum as it
    lands), awscli, s5cmd and boto3. The tools run back to
    back in a random order (the machine's load drifts); every restore is compared byte for byte;
  - reupload_s: the same checkpoint uploaded again by the same agent (nothing read or sent), and
    after a restart (every file hashed once, nothing sent);
  - notice_to_durable_s: a reclaim notice arrives a third of the way into uploading a checkpoint;
    the trainer's save on notice is a new folder of the same size (already on disk, so the
    trainer's own save time is not counted); seconds from the notice to its manifest.
The last line is, for the largest size:
checkpoint_sync size_mb=<n> sdcloud_MBps=<x> awscli_MBps=<y> s5cmd_MBps=<z> boto3_MBps=<w>
restore_MBps=<r> s5cmd_restore_MBps=<q> notice_to_durable_s=<t> reupload_s=<u>
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bootstrap")]  # the tests' helpers, as the tests import them

from tests.support.server_seaweed import TEST_KEYS, SeaweedS3  # noqa: E402

from sdcloud_agent import manifest as mf  # noqa: E402
from sdcloud_agent.store import open_store  # noqa: E402
from sdcloud_agent.sync import CheckpointSync, SyncWorker  # noqa: E402

MB = 1_000_000


def make_checkpoint(folder: Path, size_mb: int) -> Path:
    """A checkpoint shaped like a LoRA/DreamBooth save: one big weights file, an optimizer state
    about half its size, and a few small files. Random bytes (incompressible)."""
    folder.mkdir(parents=True, exist_ok=True)
    total = size_mb * MB
    small = 4096
    parts = {"model.safetensors": int(total * 0.6), "optimizer.bin": int(total * 0.3),
             "scheduler.bin": small, "random_states_0.pkl": small, "trainer_state.json": small}
    parts["ema.safetensors"] = total - sum(parts.values())
    rnd = os.urandom(16 * MB)  # fresh bytes per checkpoint: nothing to skip or copy between them
    for name, size in parts.items():
        with open(folder / name, "wb") as f:
            left = size
            while left > 0:
                n = min(left, len(rnd))
                f.write(rnd[:n])
                left -= n
    return folder


def timed(cmd: list[str], env: dict) -> float:
    t0 = time.monotonic()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.monotonic() - t0


def same_tree(a: Path, b: Path) -> bool:
    """Every file of `a` is in `b` with the same bytes (a restore really restored)."""
    for p in a.rglob("*"):
        if p.is_file():
            q = b / p.relative_to(a)
            if not q.is_file() or q.stat().st_size != p.stat().st_size or mf.sha256_file(q) != mf.sha256_file(p):
                return False
    return True


def boto3_upload(endpoint: str, folder: Path, bucket: str, prefix: str) -> float:
    """boto3's TransferManager as a user would run it: defaults, every file of the folder at once."""
    import boto3
    from boto3.s3.transfer import TransferConfig, create_transfer_manager
    client = boto3.client("s3", endpoint_url=endpoint)
    t0 = time.monotonic()
    with create_transfer_manager(client, TransferConfig()) as tm:
        futs = [tm.upload(str(p), bucket, f"{prefix}/{p.name}") for p in sorted(folder.iterdir())]
        for f in futs:
            f.result()
    return time.monotonic() - t0


def boto3_download(endpoint: str, bucket: str, prefix: str, dest: Path) -> float:
    import boto3
    from boto3.s3.transfer import TransferConfig, create_transfer_manager
    client = boto3.client("s3", endpoint_url=endpoint)
    dest.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])]
    with create_transfer_manager(client, TransferConfig()) as tm:
        futs = [tm.download(bucket, k, str(dest / k.rsplit("/", 1)[1])) for k in keys]
        for f in futs:
            f.result()
    return time.monotonic() - t0


def bench_size(size_mb: int, work: Path, endpoint: str, env: dict, store_opts: dict) -> dict:
    import boto3
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    new_store = lambda: open_store({"url": f"s3://{bucket}/agent", "endpoint_url": endpoint, **store_opts})  # noqa: E731
    store = new_store()
    a = make_checkpoint(work / f"{size_mb}/step-000000100", size_mb)
    b = make_checkpoint(work / f"{size_mb}/step-000000150", size_mb)
    c = make_checkpoint(work / f"{size_mb}/step-000000200", size_mb)
    nbytes = sum(p.stat().st_size for p in a.iterdir())
    mbps = lambda secs: nbytes / MB / secs  # noqa: E731
    aws = shutil.which("aws")
    s5 = shutil.which("s5cmd")
    nan = float("nan")
    sync = CheckpointSync(store, "runs/bench", keep=10)
    dest = work / f"{size_mb}/restore"

    def agent_up() -> float:
        # sha256 of every byte (from the same reads as the upload), manifest last.
        t0 = time.monotonic()
        sync.upload(a, 100)
        return time.monotonic() - t0

    def agent_down() -> float:
        # A fresh host: the agent's own restore (parallel ranged GETs, verified as they land).
        m = mf.newest_complete(store, "runs/bench")
        t0 = time.monotonic()
        mf.download(new_store(), "runs/bench", m, dest / "agent" / m.name)
        return time.monotonic() - t0

    ups = {
        "agent": agent_up,
        "awscli": lambda: timed([aws, "s3", "sync", str(a), f"s3://{bucket}/awscli/", "--endpoint-url", endpoint,
                                 "--only-show-errors"], env) if aws else nan,
        "s5cmd": lambda: timed([s5, "--endpoint-url", endpoint, "cp", f"{a}/*", f"s3://{bucket}/s5cmd/"],
                               env) if s5 else nan,
        "boto3": lambda: boto3_upload(endpoint, a, bucket, "boto3"),
    }
    downs = {
        "agent": agent_down,
        "awscli": lambda: timed([aws, "s3", "sync", f"s3://{bucket}/awscli/", str(dest / "awscli"),
                                 "--endpoint-url", endpoint, "--only-show-errors"], env) if aws else nan,
        "s5cmd": lambda: timed([s5, "--endpoint-url", endpoint, "cp", f"s3://{bucket}/s5cmd/*",
                                f"{dest / 's5cmd'}/"], env) if s5 else nan,
        "boto3": lambda: boto3_download(endpoint, bucket, "boto3", dest / "boto3"),
    }
    # The machine is shared and its load drifts: the tools run back to back, in a random order.
    order = list(ups)
    random.shuffle(order)
    up_s = {name: ups[name]() for name in order}
    assert mf.newest_complete(store, "runs/bench").step == 100
    down_s = {name: downs[name]() for name in order}
    assert same_tree(a, dest / "agent" / a.name), "the agent's restore differs"
    # The same restore again, and s5cmd's again: SeaweedFS serves an object's second read from its
    # chunk cache, so the second reads are printed beside the first ones.
    shutil.rmtree(dest / "agent", ignore_errors=True)
    again_agent = agent_down()
    again_s5 = nan
    if s5:
        shutil.rmtree(dest / "s5cmd", ignore_errors=True)
        again_s5 = downs["s5cmd"]()
    for name in ("awscli", "s5cmd", "boto3"):
        if (dest / name).exists():
            assert same_tree(a, dest / name), name
    shutil.rmtree(dest, ignore_errors=True)

    # The same checkpoint again (a retried upload): the agent knows every file's hash already.
    t0 = time.monotonic()
    again = sync.upload(a, 100)
    reupload_s = time.monotonic() - t0
    assert again.bytes_sent == 0, again
    # ... and from an agent that just restarted: it hashes the files (one read) and sends nothing.
    cold = CheckpointSync(new_store(), "runs/bench", keep=10)
    cold.seed()
    t0 = time.monotonic()
    assert cold.upload(a, 100).bytes_sent == 0
    reupload_cold_s = time.monotonic() - t0

    # A notice a third of the way into uploading checkpoint 200; the trainer's save on the notice
    # is checkpoint 250 (already on disk: the trainer's own save time is not counted).
    run2 = "runs/bench-notice"
    worker = SyncWorker(CheckpointSync(store, run2, keep=10))
    worker.submit(200, c)
    time.sleep(up_s["agent"] / 3)
    t_notice = time.monotonic()
    worker.set_urgent()
    worker.submit(250, b)
    worker.wait_idle()
    notice_s = time.monotonic() - t_notice
    worker.close()
    newest = mf.newest_complete(store, run2)
    assert newest is not None and newest.step == 250, newest

    for d in (a, b, c):
        shutil.rmtree(d, ignore_errors=True)
    res = {"size_mb": size_mb, "sdcloud_MBps": mbps(up_s["agent"]), "awscli_MBps": mbps(up_s["awscli"]),
           "s5cmd_MBps": mbps(up_s["s5cmd"]), "boto3_MBps": mbps(up_s["boto3"]),
           "restore_MBps": mbps(down_s["agent"]), "s5cmd_restore_MBps": mbps(down_s["s5cmd"]),
           "notice_to_durable_s": notice_s, "reupload_s": reupload_s}
    # `workers` is s3transfer's knob; the CRT sizes its own connections.
    knobs = (f" workers={store.workers}" if store.engine == "s3transfer"
             else f" target_gbps={store_opts.get('target_gbps') or 'default'}")
    knobs += f" restore_workers={store.restore_workers} range={store.range_size // 2**20}MiB"
    print(f"size={size_mb}MB engine={store.engine} part={store.part_size // 2**20}MiB{knobs} "
          f"order={','.join(order)} | upload MB/s: "
          + " ".join(f"{n} {mbps(up_s[n]):.1f}" for n in ups) + " | restore MB/s: "
          + " ".join(f"{n} {mbps(down_s[n]):.1f}" for n in downs)
          + f" | second read: agent {mbps(again_agent):.1f} s5cmd {mbps(again_s5):.1f}"
          + f" | notice_to_durable {notice_s:.2f}s reupload {reupload_s:.3f}s (after a restart {reupload_cold_s:.2f}s)",
          flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000", help="checkpoint sizes in MB, comma-separated")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--part-mib", type=int, default=None, help="the agent's part size in MiB")
    ap.add_argument("--workers", type=int, default=None, help="the agent's parallel parts/ranges")
    ap.add_argument("--target-gbps", type=float, default=None,
                    help="the CRT's throughput target, which sizes its connections (default: the agent's)")
    ap.add_argument("--engine", default=None, choices=("auto", "crt", "s3transfer"),
                    help="the agent's upload engine (default auto: CRT where awscrt is installed)")
    ap.add_argument("--restore-workers", type=int, default=None, help="the agent's parallel ranged GETs on restore")
    ap.add_argument("--range-mib", type=int, default=None, help="the agent's block (and restore range) size in MiB")
    ap.add_argument("--smoke", action="store_true", help="a quick form for the test suite: one 4 MB checkpoint")
    args = ap.parse_args()
    if args.smoke:
        args.sizes = "4"
    store_opts = {k: v for k, v in {"workers": args.workers, "engine": args.engine, "target_gbps": args.target_gbps,
                                    "part_size": args.part_mib and args.part_mib * 2**20,
                                    "restore_workers": args.restore_workers,
                                    "range_size": args.range_mib and args.range_mib * 2**20}.items() if v}
    sizes = sorted(int(s) for s in args.sizes.split(","))
    work = Path(args.workdir or tempfile.mkdtemp(prefix="sdcloud-bench-"))
    # The server speaks HTTPS with a self-signed certificate, as production does; every tool trusts
    # it through its own variable (AWS_CA_BUNDLE for botocore and awscli, SSL_CERT_FILE for s5cmd).
    server = SeaweedS3().start(timeout=180)
    key_id, secret = next(iter(TEST_KEYS.items()))
    env = {**os.environ, "AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret,
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CA_BUNDLE": str(server.ca_file), "SSL_CERT_FILE": str(server.ca_file)}
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_EC2_METADATA_DISABLED",
              "AWS_CA_BUNDLE"):
        os.environ[k] = env[k]
    os.environ.pop("AWS_PROFILE", None)
    try:
        results = [bench_size(s, work, server.endpoint, env, store_opts) for s in sizes]
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    r = results[-1]
    print(f"checkpoint_sync size_mb={r['size_mb']} sdcloud_MBps={r['sdcloud_MBps']:.1f} "
          f"awscli_MBps={r['awscli_MBps']:.1f} s5cmd_MBps={r['s5cmd_MBps']:.1f} "
          f"boto3_MBps={r['boto3_MBps']:.1f} restore_MBps={r['restore_MBps']:.1f} "
          f"s5cmd_restore_MBps={r['s5cmd_restore_MBps']:.1f} notice_to_durable_s={r['notice_to_durable_s']:.2f} "
          f"reupload_s={r['reupload_s']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
