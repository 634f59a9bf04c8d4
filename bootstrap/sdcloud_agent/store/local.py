"""A local directory as an object store (the local provider, tests, and `file://` URLs).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any, Callable

from .base import _LOCAL_META_DIR, _LOCAL_TMP_PREFIX, Cancelled, MiB, NotFound, ObjectInfo


SECRETS_DIR = "secrets"  # a run's secrets folder (runs/<id>/secrets/): its objects are 0600 here


class LocalStore:
    """A directory as an object store. Crash-safe: temp file + fsync + rename for every write."""

    compare_and_swap = True  # put_if_match is atomic (an exclusive flock around check and rename)

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        key = key.strip("/")
        if not key or ".." in key.split("/"):
            raise ValueError(f"bad key {key!r}")
        return self.root / key

    def _meta_path(self, key: str) -> Path:
        return self.root / _LOCAL_META_DIR / (key.strip("/") + ".json")

    def _write_tmp(self, final: Path, writer: Callable[[Any], None]) -> Path:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f"{_LOCAL_TMP_PREFIX}{uuid.uuid4().hex}"
        # A secret (runs/<id>/secrets/...) is readable by its owner only: the tightest a folder allows.
        mode = 0o600 if SECRETS_DIR in final.relative_to(self.root).parts else 0o666
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as f:
                writer(f)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    @staticmethod
    def _fsync_dir(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _set_meta(self, key: str, metadata: dict[str, str] | None) -> None:
        mp = self._meta_path(key)
        if not metadata:
            mp.unlink(missing_ok=True)
            return
        tmp = self._write_tmp(mp, lambda f: f.write(json.dumps(metadata).encode()))
        os.replace(tmp, mp)

    def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> None:
        final = self._path(key)
        tmp = self._write_tmp(final, lambda f: f.write(data))
        self._replace(key, tmp, final, metadata)

    def _replace(self, key: str, tmp: Path, final: Path, metadata: dict[str, str] | None) -> None:
        # Old metadata goes before the new bytes land and new metadata after: a crash in between
        # leaves an object without metadata (re-uploaded), never one with another object's sha256.
        self._meta_path(key).unlink(missing_ok=True)
        os.replace(tmp, final)
        self._fsync_dir(final.parent)
        self._set_meta(key, metadata)

    def create(self, key: str, data: bytes) -> bool:
        final = self._path(key)
        tmp = self._write_tmp(final, lambda f: f.write(data))
        try:
            os.link(tmp, final)  # fails if the name exists: an atomic create-if-absent
            self._fsync_dir(final.parent)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def put_file(self, key: str, path: str | Path, metadata: dict[str, str] | None = None,
                 cancel: threading.Event | None = None) -> str:
        final = self._path(key)
        h = hashlib.sha256()

        def copy(f):
            with open(path, "rb") as src:
                while chunk := src.read(8 * MiB):
                    if cancel is not None and cancel.is_set():
                        raise Cancelled(key)
                    h.update(chunk)
                    f.write(chunk)
        tmp = self._write_tmp(final, copy)
        self._replace(key, tmp, final, metadata)
        return h.hexdigest()

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            raise NotFound(key) from None

    def get_file(self, key: str, path: str | Path) -> str:
        src = self._path(key)
        if not src.is_file():
            raise NotFound(key)
        dest = Path(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f"{_LOCAL_TMP_PREFIX}{uuid.uuid4().hex}"
        h = hashlib.sha256()
        try:
            with open(src, "rb") as fin, open(tmp, "wb") as fout:
                while chunk := fin.read(8 * MiB):
                    h.update(chunk)
                    fout.write(chunk)
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return h.hexdigest()

    def head(self, key: str) -> ObjectInfo | None:
        p = self._path(key)
        if not p.is_file():
            return None
        try:
            meta = json.loads(self._meta_path(key).read_text())
        except (OSError, ValueError):
            meta = {}
        return ObjectInfo(key.strip("/"), p.stat().st_size, meta)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        # The walk starts at the folder the prefix names and enters only folders that can hold a
        # matching key: a listing costs what it returns, not the whole bucket (a batch job's done
        # markers are listed on every pass, beside thousands of leases and images).
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        out: list[ObjectInfo] = []
        pending = [(self.root / folder, folder + "/" if folder else "")]
        while pending:
            path, rel = pending.pop()
            try:
                entries = list(os.scandir(path))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                key = rel + entry.name
                if entry.is_dir():
                    if entry.name == _LOCAL_META_DIR or entry.is_symlink():
                        continue
                    sub = key + "/"
                    if sub.startswith(prefix) or prefix.startswith(sub):
                        pending.append((Path(entry.path), sub))
                elif not entry.name.startswith(_LOCAL_TMP_PREFIX) and key.startswith(prefix):
                    try:
                        out.append(ObjectInfo(key, entry.stat().st_size))
                    except FileNotFoundError:
                        pass
        return sorted(out, key=lambda o: o.key)

    def delete(self, keys: str | list[str]) -> None:
        for key in [keys] if isinstance(keys, str) else keys:
            for p in (self._path(key), self._meta_path(key)):
                p.unlink(missing_ok=True)
                self._prune_dirs(p.parent)

    def _prune_dirs(self, d: Path) -> None:
        # Empty folders are invisible in S3; remove them here too so listings match.
        while d != self.root and self.root in d.parents:
            try:
                d.rmdir()
            except OSError:
                return
            d = d.parent

    def copy(self, src_key: str, dst_key: str) -> None:
        info = self.head(src_key)
        if info is None:
            raise NotFound(src_key)
        self.put_file(dst_key, self._path(src_key), info.metadata)


    # -- conditional writes (batch work items and leases; see sdcloud_agent.batch) --------------
    # The local ETag is the MD5 of the bytes, as S3's is for a single PUT. Compare-and-swap holds an
    # exclusive flock on a per-key lock file, so it is atomic between processes on one file system.

    @staticmethod
    def _etag(data: bytes) -> str:
        return '"' + hashlib.md5(data).hexdigest() + '"'

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and ETag, or None when it is absent."""
        try:
            data = self.get(key)
        except NotFound:
            return None
        return data, self._etag(data)

    def put_if_absent(self, key: str, data: bytes) -> str | None:
        """Create-only write (O_EXCL semantics via link): the new ETag, or None if the key exists."""
        return self._etag(data) if self.create(key, data) else None

    def put_if_match(self, key: str, data: bytes, etag: str) -> str | None:
        """Replace the object only if its ETag is still `etag`: the new ETag, or None if it changed."""
        import fcntl

        final = self._path(key)
        lock = self.root / _LOCAL_META_DIR / (key.strip("/") + ".lock")
        lock.parent.mkdir(parents=True, exist_ok=True)
        with open(lock, "a+b") as lf:
            fcntl.flock(lf.fileno(), fcntl.LOCK_EX)
            try:
                current = self.get_versioned(key)
                if current is None or current[1] != etag:
                    return None
                tmp = self._write_tmp(final, lambda f: f.write(data))
                os.replace(tmp, final)
                self._fsync_dir(final.parent)
                return self._etag(data)
            finally:
                fcntl.flock(lf.fileno(), fcntl.LOCK_UN)
