"""The base model, fetched once and kept in the run's bucket under cache/models/, staged to local disk.

    tiny                      built from its small configs (no download), cached like any model
    org/name or org/name@rev  a Hugging Face hub repo (HF_ENDPOINT: the hub or a mirror), fetched
                              once with huggingface_hub: only the files training needs
    https://.../file          one file (a .safetensors checkpoint), fetched once
    cache:cache/models/local-<sha16>.tar[#name.safetensors]
                              a local file or folder the controller packed and uploaded by its
                              content (sdcloud.runs.inputs.models); restored, never fetched: a missing
                              key fails the model phase
    /a/local/path             used in place (the local provider's host is the user's machine)

The cache key is the model's identity (id and revision, or URL), hashed: `cache/models/<kind>-<sha16>.tar`;
an uploaded local model's key is its content's hash, and its reference names the key (and the file
inside it for a single-file checkpoint, which the trainer gets as a file path).
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


CACHE_REF = "cache:"


def is_cache_ref(model: str) -> bool:
    return model.startswith(CACHE_REF)


def split_ref(model: str) -> tuple[str, str]:
    """(bucket key, path inside the tar: "" for a folder) of a `cache:` reference."""
    key, _, inner = model[len(CACHE_REF):].partition("#")
    if not key.startswith("cache/models/") or not key.endswith(".tar") or ".." in inner.split("/"):
        raise ValueError(f"{model}: not a cache/models/<name>.tar reference")
    return key, inner


def cache_key(model: str, single_file: bool = False) -> str | None:
    """`single_file`: a hub repository fetched in kohya's SD3 layout (trainers/models.py
    single_file_selection), cached apart from its diffusers layout."""
    if is_cache_ref(model):
        return split_ref(model)[0]
    if model == "tiny":
        from .trainers import tiny
        ident = "tiny:" + hashlib.sha256(Path(tiny.__file__).read_bytes()).hexdigest()
        kind = "tiny"
    elif model.startswith(("http://", "https://")):
        ident, kind = model, "url"
    elif "/" in model and not os.path.exists(model) and not model.startswith(("/", ".")):
        ident, kind = "hub:" + model + ("#single-file" if single_file else ""), "hub"
    else:
        return None
    return f"cache/models/{kind}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.tar"


HUB_TOKEN_KEY = "secrets/hf-token"  # under the run's prefix: put there by the controller (sdcloud.runs.inputs.hub_access)


def hub_token(store, run_prefix: str) -> str | None:
    """The user's Hugging Face token for a gated model, read into memory for the fetch only (never
    logged, never written to this host's disk), or None when the run has none."""
    key = f"{run_prefix}/{HUB_TOKEN_KEY}"
    if store.head(key) is None:
        return None
    return store.get(key).decode().strip() or None


def _fetch(model: str, dest: Path, hub_token: str | None = None, single_file: bool = False) -> None:
    if model == "tiny":
        from .trainers import tiny
        tiny.save_pipeline(dest)
    elif model.startswith(("http://", "https://")):
        dest.mkdir(parents=True, exist_ok=True)
        name = model.rstrip("/").rsplit("/", 1)[-1] or "model"
        with urllib.request.urlopen(model, timeout=60) as r, open(dest / name, "wb") as f:
            shutil.copyfileobj(r, f, 1 << 20)
    else:
        # The pipeline's components in safetensors, one precision, nothing else (the trainers'
        # rule, trainers/models.py hub_selection): about 14 GB of SDXL base's ~70 GB repository.
        from .trainers.models import download_hub
        download_hub(model, dest, token=hub_token, single_file=single_file)
        shutil.rmtree(dest / ".cache", ignore_errors=True)  # huggingface_hub's bookkeeping, not the model


def stage(model: str, store, root: Path, hub_token: str | None = None,
          single_file: bool = False) -> tuple[str, str]:
    """(what to pass the trainer, how: restored | fetched | in-place)."""
    key = cache_key(model, single_file)
    if key is None:
        return model, "in-place"
    inner = split_ref(model)[1] if is_cache_ref(model) else ""
    dest = root / "models" / Path(key).stem
    if (dest / ".sdcloud-complete").exists():
        return str(dest / inner) if inner else str(dest), "local"
    if is_cache_ref(model) and store.head(key) is None:
        raise FileNotFoundError(f"{key} is not in the run's bucket: the controller uploads a local model "
                                "there before launch; was it deleted? (start the run again)")
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
        _fetch(model, tmp / "m", hub_token, single_file)
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
    if inner:
        if not (dest / inner).is_file():
            raise FileNotFoundError(f"{key} holds no {inner}")
        return str(dest / inner), how
    return str(dest), how
