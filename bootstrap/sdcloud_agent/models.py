"""The base model, fetched once and kept in the run's bucket under cache/models/, staged to local disk.

    tiny                      built from its small configs (no download), cached like any model
    org/name or org/name@rev  a Hugging Face hub repo, fetched once with huggingface_hub
    https://.../file          one file (a .safetensors checkpoint), fetched once
    /a/local/path             used in place (the controller uploads a local folder as the dataset is)

The cache key is the model's identity (id and revision, or URL), hashed: `cache/models/<kind>-<sha16>.tar`.
A tar holds the folder as is; it is written to a temp key and copied into place, so a half-written
one is never restored.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tarfile
import tempfile
import urllib.request
from pathlib import Path

log = logging.getLogger("sdcloud_agent.models")


def cache_key(model: str) -> str | None:
    if model == "tiny":
        from .trainers import tiny
        ident = "tiny:" + hashlib.sha256(Path(tiny.__file__).read_bytes()).hexdigest()
        kind = "tiny"
    elif model.startswith(("http://", "https://")):
        ident, kind = model, "url"
    elif "/" in model and not os.path.exists(model) and not model.startswith(("/", ".")):
        ident, kind = "hub:" + model, "hub"
    else:
        return None
    return f"cache/models/{kind}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.tar"


def _fetch(model: str, dest: Path) -> None:
    if model == "tiny":
        from .trainers import tiny
        tiny.save_pipeline(dest)
    elif model.startswith(("http://", "https://")):
        dest.mkdir(parents=True, exist_ok=True)
        name = model.rstrip("/").rsplit("/", 1)[-1] or "model"
        with urllib.request.urlopen(model, timeout=60) as r, open(dest / name, "wb") as f:
            shutil.copyfileobj(r, f, 1 << 20)
    else:
        from huggingface_hub import snapshot_download
        repo, _, rev = model.partition("@")
        snapshot_download(repo, revision=rev or None, local_dir=str(dest))


def stage(model: str, store, root: Path) -> tuple[str, str]:
    """(what to pass the trainer, how: restored | fetched | in-place)."""
    key = cache_key(model)
    if key is None:
        return model, "in-place"
    dest = root / "models" / Path(key).stem
    if (dest / ".sdcloud-complete").exists():
        return str(dest), "local"
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".tmp-"))
    tar_path = tmp / "model.tar"
    if store.head(key) is not None:
        store.get_file(key, tar_path)
        with tarfile.open(tar_path) as tf:
            tf.extractall(tmp / "m", filter="data") if hasattr(tarfile, "data_filter") else tf.extractall(tmp / "m")
        how = "restored"
    else:
        _fetch(model, tmp / "m")
        with tarfile.open(tar_path, "w") as tf:
            tf.add(tmp / "m", arcname=".")
        part = key + ".part"
        store.put_file(part, tar_path)
        store.copy(part, key)
        store.delete(part)
        how = "fetched"
    (tmp / "m" / ".sdcloud-complete").write_text(key)
    os.replace(tmp / "m", dest)
    shutil.rmtree(tmp, ignore_errors=True)
    log.info("model %s %s (%s)", model, how, key)
    return str(dest), how
