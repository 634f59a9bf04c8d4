"""Checkpoint sync: upload each finished checkpoint (files in parallel, big files as parallel
multipart, each file's sha256 taken from the upload's own reads), commit its manifest last, skip
content already in the bucket, keep the last K."""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import manifest as mf
from .store import MiB, Cancelled, ObjectStore, StoreError, retry, sha256_file

log = logging.getLogger("sdcloud_agent.sync")

# Small files are the ones that stay the same between checkpoints (configs, tokenizer, scheduler
# state); hashing them before the upload costs a read of little data and saves the upload.
HASH_FIRST_BELOW = 16 * MiB


@dataclass
class UploadResult:
    step: int
    bytes_total: int
    bytes_sent: int
    seconds: float
    skipped: int
    copied: int

    @property
    def mbps(self) -> float:
        return self.bytes_total / 1e6 / max(self.seconds, 1e-9)


class CheckpointSync:
    """Uploads checkpoints of one run. Thread-safe for one uploader at a time."""

    def __init__(self, store: ObjectStore, run_prefix: str, *, keep: int = 3, file_workers: int = 4,
                 attempts: int = 5, base_delay: float = 0.5, run: str = "", attempt: int = 0, trainer: str = "",
                 hash_first_below: int = HASH_FIRST_BELOW):
        self.store = store
        self.run_prefix = run_prefix
        self.keep = max(1, keep)
        self.file_workers = file_workers
        self.attempts = attempts
        self.base_delay = base_delay
        self.fields = {"run": run, "attempt": attempt, "trainer": trainer}
        self.durable_step = -1
        # sha256 -> key of a committed object with that content (server-side copy instead of upload)
        self._content: dict[str, str] = {}
        # sha256 -> block checksums of that content (for the manifest of a skipped or copied file)
        self._blocks: dict[str, mf.BlockSums] = {}
        self.prune_error: str | None = None  # why the last pruning failed (None: it did not)
        # key -> sha256 of what this agent knows is there (committed manifests and its own uploads)
        self._at_key: dict[str, str] = {}
        # (dev, inode, size, mtime_ns) -> sha256 of local files already read once
        self._hashes: dict[tuple[int, int, int, int], str] = {}
        # Files up to this size are hashed before they are sent, to skip or copy unchanged ones.
        self.hash_first_below = hash_first_below
        # What goes up with a checkpoint before its manifest (the agent's samples, samples.py): called
        # with (step, folder) once the files are durable; a checkpoint that lands has them.
        self.before_manifest: Callable[[int, Path], None] | None = None
        # Steps kept beside the newest `keep` (the checkpoints whose samples a user may pick a model by).
        self.keep_also: set[int] = set()

    def seed(self) -> None:
        """Learn what the bucket already holds (after a restart)."""
        for step in mf.complete_steps(self.store, self.run_prefix)[-self.keep:]:
            m = mf.read(self.store, self.run_prefix, step)
            if m is not None:
                self._remember(m)
                self.durable_step = max(self.durable_step, step)

    def _remember(self, m: mf.Manifest) -> None:
        base = mf.checkpoint_prefix(self.run_prefix, m.step)
        for f in m.files:
            self._content.setdefault(f.sha256, f"{base}/{f.path}")
            self._at_key[f"{base}/{f.path}"] = f.sha256
            if f.blocks is not None:
                self._blocks.setdefault(f.sha256, f.blocks)

    def _known_hash(self, path: Path, st: os.stat_result) -> str | None:
        return self._hashes.get((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))

    def _learn_hash(self, path: Path, st: os.stat_result, digest: str) -> None:
        # Keyed on the inode and its mtime: the hard-linked snapshot of a checkpoint and the
        # trainer's own folder share it; a rewrite of the file changes its mtime.
        self._hashes[(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)] = digest

    def upload(self, folder: str | Path, step: int, cancel: threading.Event | None = None) -> UploadResult:
        """Upload one local checkpoint folder as step `step`; returns once its manifest is committed.

        Each byte is read once: a file whose hash is unknown is hashed from the bytes the upload
        sends. Hashing first (then skipping or copying server-side) is worth a read only where
        a skip is likely: a small file (often unchanged between checkpoints), or an object of
        the same size already at the key (a retried upload after a restart)."""
        t0 = time.monotonic()
        folder = Path(folder)
        base = mf.checkpoint_prefix(self.run_prefix, step)
        existing = {o.key: o.size for o in self.store.list(base + "/")}
        counts = {"sent": 0, "skipped": 0, "copied": 0}
        digests: dict[str, str] = {}
        blocks: dict[str, mf.BlockSums] = {}  # from this upload's reads; skipped and copied files reuse known ones
        lock = threading.Lock()

        def present(key: str, size: int, sha: str) -> bool:
            if existing.get(key) != size:
                return False
            if self._at_key.get(key) == sha:
                return True
            info = self.store.head(key)
            return info is not None and info.metadata.get("sha256") == sha

        def one(rel: str, path: Path) -> None:
            key = f"{base}/{rel}"
            st = path.stat()
            sha = self._known_hash(path, st)
            if sha is None and (st.st_size <= self.hash_first_below or existing.get(key) == st.st_size):
                sha = sha256_file(path)
                self._learn_hash(path, st, sha)
            if sha is not None:
                if present(key, st.st_size, sha):
                    with lock:
                        counts["skipped"] += 1
                        digests[rel] = sha
                    return
                src = self._content.get(sha)
                if src is not None and src != key:
                    try:
                        self.store.copy(src, key)
                        with lock:
                            counts["copied"] += 1
                            digests[rel] = sha
                        return
                    except Exception as exc:  # noqa: BLE001 - the source may have been pruned; upload instead
                        log.info("server-side copy of %s failed (%s); uploading", src, exc)
            if cancel is not None and cancel.is_set():
                raise Cancelled(key)
            meta = {"sha256": sha} if sha is not None else None
            sent = self.store.put_file(key, path, meta, cancel=cancel)
            if sent is None:  # a store that does not hash what it sends
                sent = sha or sha256_file(path)
            if sha is not None and sent != sha:
                raise StoreError(f"{path} changed while it was being uploaded")
            if path.stat().st_mtime_ns != st.st_mtime_ns:
                raise StoreError(f"{path} changed while it was being uploaded")
            self._learn_hash(path, st, str(sent))
            with lock:
                counts["sent"] += st.st_size
                digests[rel] = str(sent)
                self._at_key[key] = str(sent)
                if getattr(sent, "sums", None) is not None:
                    blocks[rel] = sent.sums
                    self._blocks[str(sent)] = sent.sums

        def guarded(rel: str, path: Path) -> None:
            retry(lambda: one(rel, path), attempts=self.attempts, base_delay=self.base_delay,
                  log=log.warning, what=f"upload of {base}/{rel}", stop=cancel)

        # Biggest files first so that the long multipart uploads start at once.
        files = sorted(mf.entries(folder), key=lambda e: -e[2])
        with ThreadPoolExecutor(max_workers=self.file_workers) as pool:
            for fut in [pool.submit(guarded, rel, path) for rel, path, _ in files]:
                fut.result()
        if cancel is not None and cancel.is_set():
            raise Cancelled(base)
        if self.before_manifest is not None:
            hook = self.before_manifest
            try:
                retry(lambda: hook(step, folder), attempts=self.attempts, base_delay=self.base_delay,
                      log=log.warning, what=f"samples of step {step}", stop=cancel)
            except Cancelled:
                raise
            except Exception as exc:  # noqa: BLE001 - the checkpoint matters more than its pictures
                log.warning("the samples of step %d did not go up: %s", step, exc)
        m = mf.Manifest(step=step, name=folder.name, **self.fields,
                        files=[mf.FileEntry(rel, size, digests[rel], blocks.get(rel) or self._blocks.get(digests[rel]))
                               for rel, _, size in sorted(files)])
        # Every file is durable: only now may the manifest appear.
        retry(lambda: mf.write(self.store, self.run_prefix, m), attempts=self.attempts,
              base_delay=self.base_delay, log=log.warning, what=f"manifest of step {step}")
        self._remember(m)
        self.durable_step = max(self.durable_step, step)
        secs = time.monotonic() - t0
        res = UploadResult(step, m.total_bytes, counts["sent"], secs, counts["skipped"], counts["copied"])
        log.info("checkpoint %d durable: %.1f MB in %.2fs (%.1f MB/s; %d skipped, %d copied)",
                 step, m.total_bytes / 1e6, secs, res.mbps, res.skipped, res.copied)
        try:
            self.prune()
            self.prune_error = None
        except Exception as exc:  # noqa: BLE001 - pruning is housekeeping; never fail a run on it
            # ...but never hide it either: old checkpoints left behind stay on the user's bill. The
            # agent puts this in status.json and the controller turns it into a run event.
            self.prune_error = f"pruning old checkpoints failed: {exc}"
            log.warning("%s", self.prune_error)
        return res

    def prune(self) -> None:
        """Keep the newest K complete checkpoints; drop older ones and abandoned partial folders."""
        steps = mf.list_steps(self.store, self.run_prefix)
        complete = mf.complete_steps(self.store, self.run_prefix)
        if not complete:
            return
        keep = set(complete[-self.keep:]) | self.keep_also
        newest = complete[-1]
        failed: list[str] = []
        for step in sorted(steps):
            if step in keep or step > newest:
                continue  # a step above the newest may be an upload in flight
            try:
                mf.delete_checkpoint(self.store, self.run_prefix, step)
            except Exception as exc:  # noqa: BLE001 - try the other steps, then say which failed
                failed.append(f"step {step}: {exc}")
                continue
            base = mf.checkpoint_prefix(self.run_prefix, step) + "/"
            self._content = {h: k for h, k in self._content.items() if not k.startswith(base)}
            self._at_key = {k: h for k, h in self._at_key.items() if not k.startswith(base)}
            log.info("pruned checkpoint %d from the bucket", step)
        if failed:
            raise StoreError("; ".join(failed))


class SyncWorker:
    """A background thread that uploads submitted checkpoints, newest first.

    In urgent mode (a reclaim notice) a newer submission cancels an older upload in flight, so the
    newest checkpoint is the one that becomes durable first within the notice; the older ones (the
    cancelled one too) go up after it while the notice lasts, with their samples: a checkpoint the
    trainer finished is not dropped for a newer one, unless `keep` newer ones would prune it at once."""

    def __init__(self, sync: CheckpointSync, *, checkpoint_tries: int = 3):
        self.sync = sync
        self.checkpoint_tries = checkpoint_tries
        self._pending: dict[int, Path] = {}
        self._tries: dict[int, int] = {}
        self._cv = threading.Condition()
        self._cancel: threading.Event | None = None
        self._current: int | None = None
        self._stop = False
        self.urgent = False
        self.failed: list[int] = []
        self.results: list[UploadResult] = []
        self._committed: set[int] = set()  # the steps this worker made durable
        self.phase_cb = None  # called with True while uploading, False when idle
        self._thread = threading.Thread(target=self._run, name="sdcloud-sync", daemon=True)
        self._thread.start()

    @property
    def durable_step(self) -> int:
        return self.sync.durable_step

    def submit(self, step: int, folder: Path) -> None:
        with self._cv:
            if step <= self.sync.durable_step or step in self._pending or step == self._current:
                return
            self._pending[step] = Path(folder)
            if self.urgent and self._current is not None and self._current < step and self._cancel:
                log.info("notice: abandoning upload of step %d for newer step %d", self._current, step)
                self._cancel.set()
            self._cv.notify_all()

    def set_urgent(self) -> None:
        with self._cv:
            self.urgent = True
            newest = max(self._pending, default=None)
            if newest is not None and self._current is not None and self._current < newest and self._cancel:
                self._cancel.set()
            self._cv.notify_all()

    def _superseded(self, step: int) -> bool:
        """`keep` newer checkpoints are durable: pruning would delete this one as soon as it landed."""
        newer = sum(1 for s in self._committed if s > step)
        return newer >= self.sync.keep and step not in self.sync.keep_also

    def idle(self) -> bool:
        with self._cv:
            return not self._pending and self._current is None

    def wait_idle(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._pending or self._current is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left if left is not None else 1.0)
            return True

    def wait_newest(self, timeout: float) -> bool:
        """Until the newest checkpoint submitted is durable (or has failed); older ones may still be going up."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                busy = [*self._pending, *([] if self._current is None else [self._current])]
                if not busy or max(busy) <= self.sync.durable_step:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)

    def close(self) -> None:
        with self._cv:
            self._stop = True
            if self._cancel:
                self._cancel.set()
            self._cv.notify_all()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                if self.urgent:  # only the older checkpoints that pruning would delete on arrival are skipped
                    self._pending = {s: p for s, p in self._pending.items() if not self._superseded(s)}
                step = max(self._pending, default=None)
                if step is None:
                    self._cv.notify_all()
                else:
                    folder = self._pending.pop(step)
                    self._current = step
                    self._cancel = threading.Event()
                    cancel = self._cancel
            if step is None:
                if self.phase_cb:
                    self.phase_cb(False)
                continue
            if self.phase_cb:
                self.phase_cb(True)
            requeue = requeue_cancelled = False
            try:
                self.results.append(self.sync.upload(folder, step, cancel=cancel))
                self._committed.add(step)
            except Cancelled:
                log.info("upload of step %d cancelled", step)
                # For a newer one (a notice): it goes up after that one, if its folder is still there.
                requeue_cancelled = not self._stop and folder.exists()
            except (StoreError, OSError, ValueError) as exc:
                n = self._tries[step] = self._tries.get(step, 0) + 1
                if n < self.checkpoint_tries and folder.exists():
                    log.warning("upload of step %d failed (%s); will retry (%d/%d)", step, exc, n, self.checkpoint_tries)
                    requeue = True
                else:
                    log.error("upload of step %d failed for good: %s", step, exc)
                    self.failed.append(step)
            except Exception as exc:  # noqa: BLE001 - keep the worker alive whatever happens
                log.exception("upload of step %d crashed: %s", step, exc)
                self.failed.append(step)
            with self._cv:
                self._current = None
                self._cancel = None
                if requeue and step > self.sync.durable_step:
                    self._pending.setdefault(step, folder)
                if requeue_cancelled and step not in self._committed:
                    self._pending.setdefault(step, folder)
                self._cv.notify_all()
            if self.phase_cb and self.idle():
                self.phase_cb(False)
            if requeue:
                time.sleep(min(5.0, self.sync.base_delay * 4))
