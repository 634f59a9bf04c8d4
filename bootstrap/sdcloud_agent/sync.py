"""Checkpoint sync: upload each finished checkpoint (files in parallel, big files as parallel
multipart), commit its manifest last, skip content already in the bucket, keep the last K."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import manifest as mf
from .store import Cancelled, ObjectStore, StoreError, retry

log = logging.getLogger("sdcloud_agent.sync")


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
                 attempts: int = 5, base_delay: float = 0.5, run: str = "", attempt: int = 0, trainer: str = ""):
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
        self.prune_error: str | None = None  # why the last pruning failed (None: it did not)

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

    def upload(self, folder: str | Path, step: int, cancel: threading.Event | None = None) -> UploadResult:
        """Upload one local checkpoint folder as step `step`; returns once its manifest is committed."""
        t0 = time.monotonic()
        folder = Path(folder)
        m = mf.build(folder, step, **self.fields)
        base = mf.checkpoint_prefix(self.run_prefix, step)
        existing = {o.key: o.size for o in self.store.list(base + "/")}
        counts = {"sent": 0, "skipped": 0, "copied": 0}
        lock = threading.Lock()

        def one(f: mf.FileEntry) -> None:
            key = f"{base}/{f.path}"
            if existing.get(key) == f.size:
                info = self.store.head(key)
                if info is not None and info.metadata.get("sha256") == f.sha256:
                    with lock:
                        counts["skipped"] += 1
                    return
            src = self._content.get(f.sha256)
            if src is not None and src != key:
                try:
                    self.store.copy(src, key)
                    with lock:
                        counts["copied"] += 1
                    return
                except Exception as exc:  # noqa: BLE001 - the source may have been pruned; upload instead
                    log.info("server-side copy of %s failed (%s); uploading", src, exc)
            if cancel is not None and cancel.is_set():
                raise Cancelled(key)
            self.store.put_file(key, folder / f.path, {"sha256": f.sha256}, cancel=cancel)
            with lock:
                counts["sent"] += f.size

        def guarded(f: mf.FileEntry) -> None:
            retry(lambda: one(f), attempts=self.attempts, base_delay=self.base_delay,
                  log=log.warning, what=f"upload of {base}/{f.path}", stop=cancel)

        # Biggest files first so that the long multipart uploads start at once.
        files = sorted(m.files, key=lambda f: -f.size)
        with ThreadPoolExecutor(max_workers=self.file_workers) as pool:
            for fut in [pool.submit(guarded, f) for f in files]:
                fut.result()
        if cancel is not None and cancel.is_set():
            raise Cancelled(base)
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
        keep = set(complete[-self.keep:])
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
            log.info("pruned checkpoint %d from the bucket", step)
        if failed:
            raise StoreError("; ".join(failed))


class SyncWorker:
    """A background thread that uploads submitted checkpoints, newest first.

    In urgent mode (a reclaim notice) a newer submission cancels an older upload in flight, so the
    newest checkpoint is the one that becomes durable within the notice."""

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
                step = max(self._pending)
                folder = self._pending.pop(step)
                if self.urgent:  # older pending checkpoints are superseded by the newest
                    self._pending = {s: p for s, p in self._pending.items() if s > step}
                self._current = step
                self._cancel = threading.Event()
                cancel = self._cancel
            if self.phase_cb:
                self.phase_cb(True)
            requeue = False
            try:
                self.results.append(self.sync.upload(folder, step, cancel=cancel))
            except Cancelled:
                log.info("upload of step %d cancelled", step)
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
                self._cv.notify_all()
            if self.phase_cb and self.idle():
                self.phase_cb(False)
            if requeue:
                time.sleep(min(5.0, self.sync.base_delay * 4))
