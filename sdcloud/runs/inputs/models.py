"""A local base model (a .safetensors file or a diffusers folder) on its way to a remote host.

A cloud or SSH host cannot read this machine's disk, so the controller packs the model once as a
tar keyed by its content, `cache/models/local-<sha16>.tar` in the run's bucket, and the host's
agent names it by that reference (``cache:<key>``, ``#<file>`` for a single file) and restores it
to its local disk (sdcloud_agent.models). The same bytes under another path or name of folder
upload nothing; a tar is written to a temp key and copied into place, so a half-written one is
never used. The local provider's host is this machine: it reads the model in place.

The content hash is sha256 over the sorted relative paths, sizes and bytes of the files (read in
chunks); a file or folder whose (path, size, mtime) listing is unchanged reuses the hash kept in
$SDCLOUD_HOME/cache/model-hashes.json instead of reading every byte again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ... import config
from ...events import Kind
from ...providers.traits import Hosts, names

CHUNK = 8 << 20


def is_local_model(model: str | None, provider: str) -> bool:
    """A file or folder on this machine that the run's host cannot read: any host but this machine's."""
    here = provider in names(where=lambda t: t.hosts is Hosts.THIS_MACHINE)
    if not model or here or "://" in model or model.startswith("cache:"):
        return False
    from sdcloud_agent.trainers.models import is_tiny

    return not is_tiny(model) and Path(model).expanduser().exists()


def model_files(root: Path) -> list[tuple[str, Path]]:
    """(path in the tar, file) for a folder's files (symlinks followed, as in a Hugging Face cache
    snapshot), sorted; a single file is itself under its name."""
    if root.is_file():
        return [(root.name, root)]
    return sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*") if p.is_file())


def _listing(files: list[tuple[str, Path]]) -> str:
    rows = []
    for rel, p in files:
        st = p.stat()
        rows.append(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()


def content_hash(files: list[tuple[str, Path]]) -> str:
    h = hashlib.sha256()
    for rel, p in files:
        h.update(f"{rel}\0{p.stat().st_size}\0".encode())
        with open(p, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
    return h.hexdigest()


def _memo_path() -> Path:
    return config.home() / "cache" / "model-hashes.json"


def known_hash(root: Path, files: list[tuple[str, Path]]) -> str:
    """The content hash, reused when the files' (path, size, mtime) listing has not changed."""
    memo_file = _memo_path()
    try:
        memo = json.loads(memo_file.read_text())
    except (OSError, ValueError):
        memo = {}
    sig = _listing(files)
    entry = memo.get(str(root))
    if isinstance(entry, dict) and entry.get("listing") == sig and entry.get("sha256"):
        return entry["sha256"]
    digest = content_hash(files)
    if _listing(files) == sig:  # nothing changed while it was read: worth keeping
        memo[str(root)] = {"listing": sig, "sha256": digest}
        memo_file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=memo_file.parent, prefix=".model-hashes-")
        with os.fdopen(fd, "w") as f:
            json.dump(memo, f, indent=1)
        os.replace(tmp, memo_file)  # two controllers at once: the last one's memo wins, both correct
    return digest


def reference(key: str, inner: str) -> str:
    return f"cache:{key}" + (f"#{inner}" if inner else "")


def upload_model(store, model: str, event: Callable[[Kind, dict], None]) -> str:
    """Put a local model in the bucket once (by content); the reference the host's agent stages."""
    root = Path(model).expanduser().resolve()
    start = time.time()
    files = model_files(root)
    key = f"cache/models/local-{known_hash(root, files)[:16]}.tar"
    ref = reference(key, root.name if root.is_file() else "")
    size = sum(p.stat().st_size for _, p in files)
    info = {"key": key, "files": len(files), "mb": round(size / 1e6, 2)}
    if store.head(key) is not None:
        event(Kind.MODEL_UPLOADED, {**info, "sent": 0, "seconds": round(time.time() - start, 2), "cached": True})
        return ref
    tmp_dir = config.home() / "tmp"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tmp_dir, prefix="model-") as tmp:
        tar_path = Path(tmp) / "model.tar"
        with tarfile.open(tar_path, "w", dereference=True) as tf:
            for rel, p in files:
                tf.add(p, arcname=rel, recursive=False)
        part = key + ".part"
        store.put_file(part, tar_path)
        store.copy(part, key)
        store.delete(part)
    event(Kind.MODEL_UPLOADED, {**info, "sent": len(files), "seconds": round(time.time() - start, 2), "cached": False})
    return ref
