"""Seconds from "instance running" to "first training step" on the bare-root harness.

Cold: the first boot installs the pinned environment (torch 2.13.0, the CPU wheel on this machine's
disk, and the lock) and packs it to the bucket; warm: a fresh root restores it (and the tiny model)
from the bucket. Anchor in the same run: a plain `pip install` of the same lock into a fresh venv,
with nothing cached in the bucket (what a host would pay on every boot without the cache).

SeaweedFS over HTTPS on loopback is the bucket, a local IMDSv2 fake gives the role credentials.

The model phase for a repository shaped like SDXL base (tests/support/fake_hub.py, its files' published
sizes divided by --scale), served by a local hub through HF_ENDPOINT: bytes from the hub and
seconds, cold (fetch what training needs, tar, upload) and warm (restore from the bucket), beside
the full-repository download a host did before (snapshot_download with no filter).

    python bench/bootstrap.py [--model-only] [--scale 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bootstrap")]  # the tests' helpers, as the tests import them

from tests.support import harness_bareroot as bareroot  # noqa: E402
from tests.support.fake_host import AwsMetadataServer  # noqa: E402
from tests.support.server_seaweed import TEST_KEYS, SeaweedS3  # noqa: E402


def wait_first_step(store, run_id: str, timeout: float = 300) -> dict:
    end = time.time() + timeout
    while time.time() < end:
        try:
            ph = bareroot.phases(store, run_id, 1)
            if "first-step" in ph:
                return ph
            if any(p["result"] == "failed" for p in ph.values()):
                raise SystemExit(f"boot failed: {ph}")
        except Exception as exc:  # noqa: BLE001 - not written yet
            if isinstance(exc, SystemExit):
                raise
        time.sleep(0.5)
    raise SystemExit(f"{run_id}: no first step in {timeout}s")


def plain_pip(build: str) -> float:
    from sdcloud_agent import boot

    with tempfile.TemporaryDirectory(prefix="sdcloud-bench-pip-") as d:
        lock = Path(d) / "lock.txt"
        lock.write_text(boot.lock_text(build))
        env = {k: v for k, v in os.environ.items() if k.startswith("PIP_")} | {"PATH": "/usr/bin:/bin", "HOME": d}
        t0 = time.time()
        subprocess.run(["/usr/bin/python3", "-m", "venv", f"{d}/venv"], check=True, env=env)
        pip = [f"{d}/venv/bin/python", "-m", "pip", "install", "-q", "--no-input"]
        subprocess.run(pip + [boot.TORCH_PIN], check=True, env=env)
        subprocess.run(pip + ["-r", str(lock)], check=True, env=env)
        return time.time() - t0


_STAGE = """
import json, sys, time
from pathlib import Path
from sdcloud_agent import models
from sdcloud_agent.store import LocalStore
t0 = time.time()
if sys.argv[1] == "full":
    from huggingface_hub import snapshot_download
    snapshot_download(sys.argv[2], local_dir=sys.argv[4])
    how = "full"
else:
    how = models.stage(sys.argv[2], LocalStore(sys.argv[3]), Path(sys.argv[4]))[1]
print(json.dumps({"how": how, "seconds": time.time() - t0}))
"""


def model_phase(scale: int) -> None:
    """Bytes from the hub and seconds of the model phase, cold and warm, and today's full download."""
    from tests.support.fake_hub import REPO_SDXL, FakeHub, sdxl_shaped

    repo = sdxl_shaped(scale)
    work = Path(tempfile.mkdtemp(prefix="sdcloud-bench-model-"))
    try:
        with FakeHub({REPO_SDXL: repo}) as hub:
            env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "0",
                   "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "NO_PROXY": "127.0.0.1"}
            out = {}
            for name, mode, dest in (("full_repo", "full", "full"), ("cold", "stage", "host1"), ("warm", "stage", "host2")):
                before = hub.bytes_fetched()
                p = subprocess.run([sys.executable, "-c", _STAGE, mode, REPO_SDXL, str(work / "bucket"), str(work / dest)],
                                   env=env, capture_output=True, text=True, check=True)
                got = json.loads(p.stdout.strip().splitlines()[-1])
                out[name] = (hub.bytes_fetched() - before, got["seconds"], got["how"])
        tar = sum(f.stat().st_size for f in (work / "bucket").rglob("*.tar"))
        whole = sum(len(d) for d in repo.values())
        for name, (b, sec, how) in out.items():
            print(f"model {name:9s}: {b / 1e6:9.2f} MB from the hub ({b * scale / 1e9:6.1f} GB at full size) "
                  f"in {sec:.2f}s ({how})")
        print(f"bootstrap model sdxl_shaped scale=1/{scale} repo_MB={whole / 1e6:.2f} "
              f"full_repo_hub_MB={out['full_repo'][0] / 1e6:.2f} full_repo_s={out['full_repo'][1]:.2f} "
              f"cold_hub_MB={out['cold'][0] / 1e6:.2f} cold_s={out['cold'][1]:.2f} cached_tar_MB={tar / 1e6:.2f} "
              f"warm_hub_MB={out['warm'][0] / 1e6:.2f} warm_s={out['warm'][1]:.2f}")
    finally:
        subprocess.run(["rm", "-rf", str(work)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-only", action="store_true", help="only the model phase (no environment install)")
    ap.add_argument("--scale", type=int, default=1000, help="the SDXL-shaped repository's sizes divided by this")
    ap.add_argument("--smoke", action="store_true", help="a quick form for the test suite: the model phase at 1/100000")
    args = ap.parse_args()
    if args.smoke:
        args.model_only, args.scale = True, 100_000
    model_phase(args.scale)
    if args.model_only:
        return
    from sdcloud.runs.driving.hostboot import cloud_user_data
    from sdcloud_agent.store import open_store

    weed = SeaweedS3().start()
    imds = AwsMetadataServer().start()
    key = next(iter(TEST_KEYS))
    imds.attach_role("bench-host", key, TEST_KEYS[key])
    os.environ.update({"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": TEST_KEYS[key],
                       "AWS_CA_BUNDLE": str(weed.ca_file), "AWS_DEFAULT_REGION": "us-east-1"})
    boots = []
    work = Path(tempfile.mkdtemp(prefix="sdcloud-bench-boot-"))
    try:
        conf = {"url": "s3://bench-boot/sdcloud", "endpoint_url": weed.endpoint, "region": "us-east-1"}
        store = open_store(conf)
        store.ensure_bucket()
        results = {}
        for name in ("cold", "warm"):
            root = work / name
            cfg = {"run_id": f"r-{name}", "attempt": 1, "model": "tiny", "steps": 1000, "checkpoint_every": 500,
                   "store": conf, "metadata": {"kind": "aws", "base_url": imds.base_url}, "require_gpu": False,
                   "nvme": False, "workdir": str(root / "var/lib/sdcloud/work"), "heartbeat_seconds": 1}
            b = bareroot.boot(root, cloud_user_data("aws", store, cfg), weed.ca_file, imds.base_url)
            boots.append(b)
            if b.rc != 0:
                raise SystemExit(f"{name} boot failed:\n{b.log[-3000:]}")
            ph = wait_first_step(store, cfg["run_id"])
            b.kill()
            results[name] = ph
        pip_s = plain_pip("cpu")
        cold, warm = (bareroot.time_to_first_step(results[n]) for n in ("cold", "warm"))
        for n in ("cold", "warm"):
            print(f"{n:5s} boot: " + "  ".join(f"{p['name']}={p['seconds']:.1f}s({p['result'].split()[0]})"
                                               for p in results[n].values()))
        print(f"bootstrap to_first_step cold_s={cold:.1f} warm_s={warm:.1f} plain_pip_install_s={pip_s:.1f} "
              f"(env phase cold={results['cold']['env']['seconds']:.1f}s warm={results['warm']['env']['seconds']:.1f}s)")
    finally:
        for b in boots:
            b.kill()
        imds.stop()
        weed.stop()
        subprocess.run(["rm", "-rf", str(work)])


if __name__ == "__main__":
    main()
