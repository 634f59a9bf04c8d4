"""The host's boot steps that need more than shell: run by the user-data from the agent wheel itself
(`PYTHONPATH=agent.whl python3 -m sdcloud_agent.boot ...`, standard library only, Python 3.10+)
before any package is installed, and by the agent for its own phases.

    cuda                                      the torch wheel index tag for this host's driver
    env --config C --wheel W --dest DIR       restore the training environment from cache/env/ in
                                              the bucket, or install the pinned lock and cache it
    put --config C KEY FILE                   upload a large file with the agent's store (multipart)

The environment cache key is (lock hash, torch build, Python version): one tar per combination at
`cache/env/<lock sha16>-<cu126|cu130|cpu>-py311.tar.zst`. A restore untars it in place; the agent wheel
is then (re)installed into it without dependencies, so a new agent version never invalidates it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

from . import gpu, s3lite

TORCH_PIN = "torch==2.13.0"
# The CUDA build of PyPI's own Linux x86_64 wheel of TORCH_PIN: its metadata requires cuda-toolkit
# 13.0.3 and the cu13 NVIDIA packages (docs/providers-tencent.md). A host that needs this build takes
# torch from the package index like every other package, so a mirror of PyPI is all it needs.
PYPI_TORCH_BUILD = "cu130"
LOCKS = {"cpu": "env-lock.txt", "cuda": "env-lock-cuda.txt"}


def lock_text(build: str) -> str:
    """The lock for this build (CUDA builds add bitsandbytes), includes resolved, as one text."""
    data = resources.files("sdcloud_agent").joinpath("data")
    name = LOCKS["cpu" if build == "cpu" else "cuda"]
    out = []
    for line in data.joinpath(name).read_text().splitlines():
        if line.startswith("-r "):
            out.append(data.joinpath(line[3:].strip()).read_text())
        else:
            out.append(line + "\n")
    return "".join(out)


def env_key(build: str, python: str | None = None) -> tuple[str, str]:
    """(bucket key, compression program) of the cached environment."""
    python = python or f"{sys.version_info[0]}{sys.version_info[1]}"
    digest = hashlib.sha256((TORCH_PIN + "\n" + lock_text(build)).encode()).hexdigest()[:16]
    if shutil.which("zstd"):
        return f"cache/env/{digest}-{build}-py{python}.tar.zst", "zstd -T0 -3"
    return f"cache/env/{digest}-{build}-py{python}.tar.gz", "gzip -1"


def _run(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def _result(boot_dir: Path | None, text: str) -> None:
    if boot_dir is not None:
        (boot_dir / "result").write_text(text)


def torch_install_args(build: str) -> list[str]:
    """pip's arguments for torch, first: from the package index when its wheel is this host's build
    (the CPU host's local wheel, or PyPI's CUDA build), else from the index of its CUDA build (the
    run's torch_index_url, which also wins when it is set: network.py)."""
    if build == "cpu" or (build == PYPI_TORCH_BUILD and not os.environ.get("SDCLOUD_TORCH_INDEX_URL")):
        return [TORCH_PIN]
    return [TORCH_PIN, "--index-url", gpu.torch_index(build)]


def env_phase(cfg: dict, wheel: Path, dest: Path, boot_dir: Path | None = None) -> str:
    """restored | installed; the environment at `dest` has the lock and the agent either way."""
    from .network import apply as apply_network
    for var, value in apply_network(cfg.get("network")).items():  # pip and the torch index below
        print(f"network: {var}={value}", flush=True)
    bucket = s3lite.Bucket(cfg["store"] if isinstance(cfg["store"], dict) else {"url": cfg["store"]},
                           cfg.get("metadata") or {})
    build = gpu.host_torch_build()
    key, compressor = env_key(build)
    print(f"environment: torch build {build}, cache key {key}", flush=True)
    py = dest / "bin" / "python"
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        packed = Path(tmp) / Path(key).name
        if bucket.head(key) is not None:
            t0 = time.time()
            bucket.get(key, str(packed))
            shutil.rmtree(dest, ignore_errors=True)
            _run(["tar", "-C", str(dest.parent), "-I", compressor.split()[0], "-xf", str(packed)])
            how = f"restored {packed.stat().st_size / 1e6:.0f} MB in {time.time() - t0:.1f}s"
        else:
            shutil.rmtree(dest, ignore_errors=True)
            _run([sys.executable, "-m", "venv", str(dest)])
            lock = Path(tmp) / "lock.txt"
            lock.write_text(lock_text(build))
            pip = [str(py), "-m", "pip", "install", "--no-input", "--disable-pip-version-check"]
            _run(pip + torch_install_args(build))
            _run(pip + ["-r", str(lock)])
            _run(["tar", "-C", str(dest.parent), "-I", compressor, "-cf", str(packed), dest.name])
            # boto3 is in the environment now: multipart upload with the agent's own store.
            _run([str(py), "-c", "import sys; sys.path.insert(0, sys.argv[1]); from sdcloud_agent.boot import main; "
                  "sys.exit(main(sys.argv[2:]))", str(wheel), "put", "--config", cfg["_path"], key, str(packed)])
            how = f"installed and cached {packed.stat().st_size / 1e6:.0f} MB"
    # The agent itself: never cached, so a new version is just this install.
    _run([str(py), "-m", "pip", "install", "--no-input", "--no-deps", "--force-reinstall", "--quiet", str(wheel)])
    kind = how.split()[0]
    _result(boot_dir, kind)
    print(f"environment {how}", flush=True)
    return kind


def put(cfg: dict, key: str, path: str) -> None:
    from .store import open_store

    store = open_store(cfg["store"])
    part = key + ".part"  # whole or not at all: a restore never sees a half-written cache
    store.put_file(part, path)
    store.copy(part, key)
    store.delete(part)


def record(boot_dir: Path, name: str, seconds: float, result: str) -> None:
    """One phase line in the phases file that the boot report carries."""
    with open(boot_dir / "phases.jsonl", "a") as f:
        f.write(json.dumps({"name": name, "seconds": round(seconds, 2), "result": result, "at": time.time()}) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sdcloud_agent.boot")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("cuda")
    e = sub.add_parser("env")
    e.add_argument("--config", required=True)
    e.add_argument("--wheel", required=True, type=Path)
    e.add_argument("--dest", required=True, type=Path)
    e.add_argument("--boot-dir", type=Path)
    u = sub.add_parser("put")
    u.add_argument("--config", required=True)
    u.add_argument("key")
    u.add_argument("file")
    a = p.parse_args(argv)
    if a.cmd == "cuda":
        print(gpu.host_torch_build())
        return 0
    cfg = json.loads(Path(a.config).read_text())
    cfg["_path"] = a.config
    if a.cmd == "env":
        env_phase(cfg, a.wheel.resolve(), a.dest, a.boot_dir)
    else:
        put(cfg, a.key, a.file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
