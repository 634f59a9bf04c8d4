"""The checkpoint manifest: THE one module that owns its format (agent and control plane both use it).

Bucket layout, relative to the run's prefix (`runs/<run_id>`):

    checkpoints/<step:09d>/<file>...          the checkpoint's files (paths relative to its folder)
    checkpoints/<step:09d>/manifest.json      written last; the checkpoint exists only once it is there

manifest.json (format 1):

    {"format": 1, "step": 120, "name": "checkpoint-120", "created": 1700000000.0,
     "trainer": "diffusers", "run": "r-1", "attempt": 2,
     "files": [{"path": "model.safetensors", "size": 123, "sha256": "...",
                "blocks": {"alg": "crc64nvme", "block": 33554432, "crc": ["16 hex digits", ...]}}, ...]}

`name` is the folder name the trainer gave the checkpoint, so that a restore recreates it exactly.

`sha256` names a file's content (a re-upload of the same bytes is skipped or copied by it).
`blocks`, where the uploader had awscrt, holds a CRC64/NVME per `block` bytes, taken from the same
reads as the sha256: a restore checks each ranged GET against its block as it lands, at a small
part of sha256's CPU cost, and a file without `blocks` (or a host without awscrt) is checked by its
sha256 instead. Readers that predate `blocks` ignore it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from .store import NotFound, ObjectStore, StoreError, sha256_file
from .transfer import BlockSums, ChecksumMismatch

FORMAT = 1
MANIFEST_NAME = "manifest.json"
CHECKPOINTS = "checkpoints"


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str
    blocks: BlockSums | None = None


@dataclass
class Manifest:
    step: int
    files: list[FileEntry]
    name: str = ""
    created: float = field(default_factory=time.time)
    trainer: str = ""
    run: str = ""
    attempt: int = 0
    format: int = FORMAT

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> bytes:
        d = asdict(self)
        return json.dumps(d, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "Manifest":
        d = json.loads(data)
        if d.get("format") != FORMAT:
            raise ValueError(f"unknown manifest format {d.get('format')!r}")
        files = [FileEntry(str(f["path"]), int(f["size"]), str(f["sha256"]), _blocks(f.get("blocks")))
                 for f in d["files"]]
        for f in files:
            if f.path.startswith("/") or ".." in f.path.split("/"):
                raise ValueError(f"bad path in manifest: {f.path!r}")
        return cls(step=int(d["step"]), files=files, name=str(d.get("name", "")),
                   created=float(d.get("created", 0)), trainer=str(d.get("trainer", "")),
                   run=str(d.get("run", "")), attempt=int(d.get("attempt", 0)))


def _blocks(d: dict | None) -> BlockSums | None:
    if not d:
        return None
    return BlockSums(str(d["alg"]), int(d["block"]), tuple(str(c) for c in d["crc"]))


def checkpoint_prefix(run_prefix: str, step: int) -> str:
    return "/".join(p for p in (run_prefix.strip("/"), CHECKPOINTS, f"{step:09d}") if p)


def local_files(folder: Path) -> list[Path]:
    """Every regular file under a checkpoint folder, sorted (temp files of a local store excluded)."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".tmp-"))


def entries(folder: str | Path) -> list[tuple[str, Path, int]]:
    """(relative path, path, size) of every file of a local checkpoint folder, sorted."""
    folder = Path(folder)
    return [(p.relative_to(folder).as_posix(), p, p.stat().st_size) for p in local_files(folder)]


def build(folder: str | Path, step: int, *, workers: int = 4, **fields) -> Manifest:
    """Hash every file of a local checkpoint folder (in parallel) into a manifest."""
    folder = Path(folder)
    paths = local_files(folder)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        digests = list(pool.map(sha256_file, paths))
    files = [FileEntry(p.relative_to(folder).as_posix(), p.stat().st_size, d) for p, d in zip(paths, digests)]
    fields.setdefault("name", folder.name)
    return Manifest(step=step, files=files, **fields)


def write(store: ObjectStore, run_prefix: str, manifest: Manifest) -> str:
    """Commit a checkpoint: call only after every file is durable in the store."""
    key = f"{checkpoint_prefix(run_prefix, manifest.step)}/{MANIFEST_NAME}"
    store.put(key, manifest.to_json())
    return key


def read(store: ObjectStore, run_prefix: str, step: int) -> Manifest | None:
    try:
        return Manifest.from_json(store.get(f"{checkpoint_prefix(run_prefix, step)}/{MANIFEST_NAME}"))
    except NotFound:
        return None
    except (ValueError, KeyError, TypeError):
        return None


def list_steps(store: ObjectStore, run_prefix: str) -> dict[int, dict[str, int]]:
    """step -> {relative key: size} for every checkpoint folder in the bucket, complete or not."""
    base = "/".join(p for p in (run_prefix.strip("/"), CHECKPOINTS) if p) + "/"
    out: dict[int, dict[str, int]] = {}
    for obj in store.list(base):
        rest = obj.key[len(base):]
        step_s, _, rel = rest.partition("/")
        if step_s.isdigit() and rel:
            out.setdefault(int(step_s), {})[rel] = obj.size
    return out


def complete_steps(store: ObjectStore, run_prefix: str) -> list[int]:
    """Steps with a readable manifest whose files are all present with the right sizes, ascending."""
    found = list_steps(store, run_prefix)
    good = []
    for step in sorted(found):
        if MANIFEST_NAME not in found[step]:
            continue
        m = read(store, run_prefix, step)
        if m is None or m.step != step:
            continue
        if all(found[step].get(f.path) == f.size for f in m.files):
            good.append(step)
    return good


def newest_complete(store: ObjectStore, run_prefix: str) -> Manifest | None:
    """The manifest of the newest complete checkpoint of a run (prefix `runs/<run_id>`), or None."""
    steps = complete_steps(store, run_prefix)
    return read(store, run_prefix, steps[-1]) if steps else None


class CorruptCheckpoint(Exception):
    pass


def download(store: ObjectStore, run_prefix: str, manifest: Manifest, dest: str | Path, *,
             workers: int = 4) -> Path:
    """Fetch a checkpoint into `dest` (created atomically: a temp folder renamed when every file
    matched its block checksums or its sha256). Raises CorruptCheckpoint on a mismatch."""
    dest = Path(dest)
    tmp = dest.parent / f".tmp-restore-{uuid.uuid4().hex}"
    tmp.mkdir(parents=True)
    base = checkpoint_prefix(run_prefix, manifest.step)

    def fetch(f: FileEntry) -> None:
        target = tmp / f.path
        key = f"{base}/{f.path}"
        if f.blocks is not None and f.blocks.usable() and getattr(store, "verifies_blocks", False):
            try:
                # Each range checked as it lands; an object of another size fails its block count
                # or its last block (the store's own HEAD gives the size: no second one here).
                store.get_file(key, target, sums=f.blocks)
            except ChecksumMismatch as exc:
                raise CorruptCheckpoint(f"{exc} (its sha256 would differ from the manifest's)") from None
            if target.stat().st_size != f.size:
                raise CorruptCheckpoint(f"{key}: {target.stat().st_size} bytes, the manifest says {f.size}")
            return
        # The store hashes the bytes as they arrive; one that cannot say gets hashed from disk.
        digest = store.get_file(key, target)
        if target.stat().st_size != f.size:
            raise CorruptCheckpoint(f"{key}: {target.stat().st_size} bytes, the manifest says {f.size}")
        if (digest or sha256_file(target)) != f.sha256:
            # Once more from disk before the file is called corrupt: a store whose digest was
            # taken while bytes still landed may have hashed some that were not there yet.
            if digest is None or sha256_file(target) != f.sha256:
                raise CorruptCheckpoint(f"{key}: sha256 differs from the manifest")

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(fetch, manifest.files))
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def restore_newest(store: ObjectStore, run_prefix: str, dest_for: Callable[[Manifest], Path], *,
                   attempts: int = 3, log: Callable[[str], None] | None = None) -> tuple[Manifest, Path] | None:
    """Download the newest checkpoint that restores whole: one whose file is missing, truncated or
    fails its checksums falls back to the one before. Transport errors are retried; a bad checksum is
    not (the bytes in the bucket will not change)."""
    for step in reversed(complete_steps(store, run_prefix)):
        m = read(store, run_prefix, step)
        if m is None:
            continue
        dest = dest_for(m)
        for i in range(attempts):
            try:
                return m, download(store, run_prefix, m, dest)
            except CorruptCheckpoint as exc:
                if log:
                    log(f"checkpoint {step} cannot be restored ({exc}); trying an older one")
                break
            except (StoreError, OSError) as exc:
                if log:
                    log(f"restore of checkpoint {step} failed ({exc})"
                        + ("; trying an older one" if i == attempts - 1 else "; retrying"))
                if i < attempts - 1:
                    time.sleep(min(4.0, 0.5 * 2 ** i))
    return None


def delete_checkpoint(store: ObjectStore, run_prefix: str, step: int) -> None:
    """Remove one checkpoint, manifest first so that it is never seen complete but partial."""
    base = checkpoint_prefix(run_prefix, step)
    store.delete(f"{base}/{MANIFEST_NAME}")
    keys = [o.key for o in store.list(base + "/")]
    if keys:
        store.delete(keys)
