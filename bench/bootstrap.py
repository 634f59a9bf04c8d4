"""Seconds from "instance running" to "first training step" on the bare-root harness.

Cold: the first boot installs the pinned environment (torch 2.13.0, the CPU wheel on this machine's
disk, and the lock) and packs it to the bucket; warm: a fresh root restores it (and the tiny model)
from the bucket. Anchor in the same run: a plain `pip install` of the same lock into a fresh venv,
with nothing cached in the bucket (what a host would pay on every boot without the cache).

SeaweedFS over HTTPS on loopback is the bucket, a local IMDSv2 fake gives the role credentials.

    python bench/bootstrap.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT), str(ROOT / "bootstrap")]

import bareroot  # noqa: E402
from agent_fakes import AwsMetadataServer  # noqa: E402
from servers import TEST_KEYS, SeaweedS3  # noqa: E402


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


def main() -> None:
    from sdcloud.runs.hostboot import cloud_user_data
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
