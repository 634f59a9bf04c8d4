"""The host agent's lifecycle: NVMe, GPU check, staging, restore, train, sync, watch, report.

    starting -> staging -> restoring -> training -> (saving -> uploading) -> succeeded | failed | preempted

Exit codes: 0 succeeded, 3 preempted, 1 failed.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import gpu, manifest as mf, nvme, staging
from . import hostphases
from . import oom as oomlib
from . import health as healthlib
from .lease import Lease, LeaseHeld
from . import selfend
from .config import AgentConfig
from .status import StatusReporter
from .store import Cancelled, StoreError, attempt_cause, describe_failure, open_store, retry
from .sync import CheckpointSync, SyncWorker
from .trainers.base import Context, Trainer
from .clouds import make_watcher
from .watchers import Notice, WatchThread

log = logging.getLogger("sdcloud_agent")
trainer_log = logging.getLogger("sdcloud_agent.trainer")

EXIT_SUCCEEDED, EXIT_FAILED, EXIT_PREEMPTED = 0, 1, 3
# Another live agent holds the run: this one left without touching it.
EXIT_LEASE_HELD = 4
# Seconds we assume we have when the agent itself gets SIGTERM (systemd stop at host shutdown).
SIGTERM_GRACE_S = 90.0
TAIL_LINES = 40


def make_trainer(name: str) -> Trainer:
    if name == "builtin":
        from .trainers.builtin_adapter import BuiltinTrainer
        return BuiltinTrainer()
    if name == "diffusers":
        from .trainers.diffusers import DiffusersTrainer
        return DiffusersTrainer()
    if name == "kohya":
        from .trainers.kohya import KohyaTrainer
        return KohyaTrainer()
    if name == "command":
        from .trainers.command import CommandTrainer
        return CommandTrainer()
    raise ValueError(f"unknown trainer {name!r}")


class Failure(Exception):
    """A run-ending problem with a reason for status.json. With `boot_phase` it is this host's
    problem (a GPU it cannot use, a model or dataset it cannot stage): the controller ends the
    attempt and tries another offer."""

    def __init__(self, reason: str, boot_phase: str | None = None, cause: str | None = None):
        super().__init__(reason)
        self.boot_phase = boot_phase
        self.cause = cause  # status.json's failure_cause (docs/runs.md, "Why an attempt ended")


class Agent:
    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.workdir = Path(cfg.workdir)
        self.notice: Notice | None = None
        self.notice_event = threading.Event()
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.trainer = make_trainer(cfg.trainer)
        self.store = None
        self.status: StatusReporter | None = None
        self.worker: SyncWorker | None = None
        self.log_path: Path | None = None
        self._snaps: dict[int, Path] = {}
        self._started = time.monotonic()
        self._started_wall = time.time()
        self._first_step = False
        self._resumed_from: int | None = None
        # Self-end (selfend.py): the controller's heartbeat, and the lifetime cap once it is reached.
        self.self_end = selfend.SelfEnd.from_dict(cfg.self_end)
        self.attendance: selfend.Attendance | None = None
        self.cap_reason: str | None = None
        self.oom = oomlib.Detector()  # CUDA out-of-memory in the trainer's output (oom.py)
        self.healer: oomlib.Healer | None = None
        self.health = healthlib.Monitor()  # samples and verdicts for status.json `health` (health.py)

    # -- setup ------------------------------------------------------------------------------
    def _setup_logging(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / f"attempt-{self.cfg.attempt}.log"
        handler = logging.FileHandler(self.log_path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger("sdcloud_agent")
        root.setLevel(logging.INFO)
        root.addHandler(handler)
        self._handlers = [handler]

    def _on_notice(self, notice: Notice) -> None:
        if notice.kind == "terminate":
            if self.notice is None:
                self.notice = notice
                self.notice_event.set()
        elif notice.kind == "rebalance" and self.notice is None:
            # Elevated reclaim risk: take a checkpoint now if the trainer can, and keep training.
            proc = getattr(self, "proc", None)
            if proc is not None and proc.poll() is None and self.trainer.request_save(proc):
                log.info("rebalance recommendation: asked the trainer for a checkpoint")

    def _on_sigterm(self, signum, frame) -> None:
        now = time.time()
        self._on_notice(Notice("terminate", now + SIGTERM_GRACE_S, now, "agent got SIGTERM (host shutdown)"))

    def _gauges(self) -> dict:
        out = {"disk_free_gb": staging.disk_free_gb(self.workdir)}
        # Old checkpoints that could not be deleted stay on the user's bill: the controller reports it.
        out["prune_error"] = self.worker.sync.prune_error if self.worker is not None else None
        out["health"] = self.health.summary()
        if self.cfg.require_gpu:
            out["gpu_util"] = gpu.utilisation()
        if self.attendance is not None:  # `unattended`: the controller's heartbeat is stale
            out["unattended"] = self.attendance.unattended()
        return out

    # -- phases -----------------------------------------------------------------------------
    def _prepare_disk(self) -> None:
        mount = self.cfg.mount_point
        if mount is None:
            return
        path, p = nvme.setup(mount)
        if path is not None:
            # Everything bulky (dataset, checkpoints) goes on the fast local disk.
            self.workdir = path / "sdcloud" / self.cfg.run_id
            self.workdir.mkdir(parents=True, exist_ok=True)
            log.info("working on local NVMe: %s", self.workdir)

    def _check_gpu(self) -> None:
        gpus = gpu.query()
        self.gpu_count = len(gpus)
        for g in gpus:
            log.info("GPU: %s, %.1f GB, driver %s", g.name, g.vram_gb, g.driver)
        res = gpu.check(gpus, self.cfg.min_vram_gb, self.cfg.rec_vram_gb, self.cfg.require_gpu)
        for w in res.warnings:
            log.warning(w)
        if not res.ok:
            raise Failure(res.reason, boot_phase="gpu")

    def _stage(self) -> Path | None:
        if not self.cfg.dataset:
            return None
        self.status.set_phase("staging")
        opts = {k: v for k, v in self.cfg.store.items() if k != "url"}
        try:
            with self.phases.phase("dataset"):
                return staging.stage(self.cfg.dataset, self.workdir / "dataset", opts).path
        except (StoreError, OSError) as exc:
            raise Failure(f"staging the dataset failed: {exc}", boot_phase="dataset") from exc

    def _stage_model(self) -> str:
        """The base model from the bucket's cache/models/ (fetched and cached once), on local disk."""
        from . import models

        # The local and SSH hosts: the trainer reads the model as given, but for a local model the
        # controller uploaded (a `cache:` reference), which every host restores from the bucket.
        if not self.phases.enabled and not models.is_cache_ref(self.cfg.model):
            return self.cfg.model

        try:
            with self.phases.phase("model") as ph:
                path, how = models.stage(self.cfg.model, self.store, self.workdir)
                ph.result = how
        except Exception as exc:  # noqa: BLE001 - any fetch error is this host's boot failure
            raise Failure(f"staging the model {self.cfg.model} failed: {exc}", boot_phase="model") from exc
        if self.cfg.model == "tiny" and self.cfg.trainer == "builtin":
            # The folder holds the same tiny pipeline the builtin trainer builds at 32 px.
            args = self.cfg.trainer_args
            if isinstance(args, dict) and "resolution" not in args:
                self.cfg.trainer_args = {**args, "resolution": 32}
            elif isinstance(args, list) and "--resolution" not in args:
                self.cfg.trainer_args = [*args, "--resolution", "32"]
        return path

    def _stage_trainer_sources(self):
        """kohya sd-scripts or the diffusers examples on this host (boot phase "trainer"), from the
        bucket's cache/trainers/ or fetched with git and cached once; None when the run brings its
        own launcher or script (or its trainer is not an external one)."""
        from . import scripts

        if not scripts.needed(self.cfg.trainer, self.cfg.trainer_args):
            return None
        try:
            with self.phases.phase("trainer") as ph:
                bucket_only = self.cfg.network.get("trainer_sources") == "bucket"  # never GitHub (network.py)
                src = scripts.stage(self.cfg.trainer, self.store, self.workdir,
                                    {**self.cfg.trainer_sources, "bucket_only": bucket_only})
                ph.result = src.how
        except Exception as exc:  # any fetch or install error is this host's boot failure
            raise Failure(f"putting the {self.cfg.trainer} trainer on this host failed: {exc}",
                          boot_phase="trainer") from exc
        log.info("trainer %s: sources %s (%s), python %s", self.cfg.trainer, src.tree, src.how, src.python)
        return src

    def _stage_bucket_model(self, model: str) -> str:
        """A base model in a bucket (a diffusers folder or one .safetensors file) is copied to
        local disk like the dataset; the trainer gets the local path."""
        if not staging.is_remote(model):
            return model
        self.status.set_phase("staging")
        opts = {k: v for k, v in self.cfg.store.items() if k != "url"}
        dest = self.workdir / "model"
        try:
            if model.lower().endswith((".safetensors", ".ckpt")):
                parent, name = model.rsplit("/", 1)
                dest.mkdir(parents=True, exist_ok=True)
                src = open_store({"url": parent, **opts})
                retry(lambda: src.get_file(name, dest / name), what=f"download of {name}", log=log.warning)
                return str(dest / name)
            return str(staging.stage(model.rstrip("/"), dest, opts).path)
        except (StoreError, OSError) as exc:
            raise Failure(f"staging the model {model} failed: {exc}") from exc

    def _restore_newest(self, ctx: Context) -> tuple[object, float]:
        """The newest checkpoint that restores whole, or None, and the seconds it took. Runs on a
        thread of its own beside the model, trainer and dataset staging (`_run`)."""
        t0 = time.monotonic()
        got = mf.restore_newest(self.store, self.cfg.run_prefix, lambda m: self.trainer.restore_dir(ctx, m.name),
                                log=log.warning)
        return got, time.monotonic() - t0

    def _restore(self, ctx: Context, restoring: concurrent.futures.Future) -> None:
        """Wait for the checkpoint restore started before staging and take it up in `ctx`."""
        if not restoring.done():
            self.status.set_phase("restoring")
        t0 = time.monotonic()
        got, secs = restoring.result()
        waited = time.monotonic() - t0
        sync = self.worker.sync
        if got is not None:
            m, dest = got
            step = m.step
            log.info("restored checkpoint %d (%.1f MB in %.2fs, %.2fs of it after staging) to %s",
                     step, m.total_bytes / 1e6, secs, waited, dest)
            self.phases.record("checkpoint", secs, f"step {step}")
            ctx.resume, ctx.resume_step = dest, step
            self._resumed_from = step
            sync.durable_step = max(sync.durable_step, step)
            # resumed_from: where this attempt took up the work (the controller tells the user).
            self.status.update(step=step, resumed_from=step)
            return
        self.phases.record("checkpoint", secs, "none")
        log.info("no complete checkpoint in the bucket: starting from step 0")

    def _start_trainer(self, ctx: Context) -> subprocess.Popen:
        try:
            cmd = self.trainer.command(ctx)
        except FileNotFoundError as exc:  # a script name that the trainer's sources do not have
            raise Failure(str(exc)) from exc
        env = {**os.environ, **self.trainer.environment(ctx), **ctx.env}
        log.info("starting trainer: %s", " ".join(cmd))
        # Its own session and process group: a notice signals it (and accelerate's workers) on
        # purpose, and a Ctrl-C or SIGTERM aimed at the agent does not reach it by accident.
        proc = subprocess.Popen(cmd, cwd=ctx.workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, bufsize=0,
                                preexec_fn=_die_with_parent)
        log.info("trainer pid %d", proc.pid)
        self._reader = threading.Thread(target=self._read_output, args=(proc,), name="sdcloud-trainer-out", daemon=True)
        self._reader.start()
        return proc

    def _read_output(self, proc: subprocess.Popen) -> None:
        buf = b""
        while True:
            chunk = proc.stdout.read(65536)
            if not chunk:
                break
            buf += chunk
            # tqdm redraws with \r: every fragment is a line for us.
            *lines, buf = buf.replace(b"\r", b"\n").split(b"\n")
            for raw in lines:
                self._handle_line(raw.decode("utf-8", "replace").rstrip())
        if buf:
            self._handle_line(buf.decode("utf-8", "replace").rstrip())

    def _handle_line(self, line: str) -> None:
        if not line:
            return
        self.tail.append(line)
        trainer_log.info("%s", line)
        self.oom.feed(line)
        prog = self.trainer.parse_line(line)
        self.health.feed_line(line, prog)
        if prog:
            self.status.update(**prog)
            if prog.get("step") and not self._first_step:
                self._first_step = True
                self.phases.first_step()
                if self._resumed_from is not None:
                    # From this agent's start to training again: the restore, the staging beside
                    # it and the trainer's own start-up (the boot report has the host's share).
                    secs = time.monotonic() - self._started
                    log.info("launch_to_resumed_s=%.1f (resumed from checkpoint %d)", secs, self._resumed_from)
                    self.status.update(resumed_after_s=round(secs, 1))

    def _submit_finished(self, ctx: Context, exited: bool = False, killed: bool = False) -> None:
        for c in self.trainer.finished(ctx, trainer_exited=exited, killed=killed):
            if c.step > self.worker.durable_step and c.path.resolve() != (ctx.resume.resolve() if ctx.resume else None):
                self.worker.submit(c.step, self._snapshot(c.step, c.path))
        # Snapshots of durable (or superseded) checkpoints only hold disk space now.
        durable = self.worker.durable_step
        for step, snap in list(self._snaps.items()):
            if step <= durable and self.worker.idle():
                shutil.rmtree(snap, ignore_errors=True)
                del self._snaps[step]

    def _snapshot(self, step: int, path: Path) -> Path:
        """Hard-link a finished checkpoint into a folder the trainer never touches, so that its
        clean-up of old checkpoints cannot pull files from under an upload."""
        snap = self.workdir / "snapshots" / path.name
        if snap.exists():
            return snap
        self._snaps[step] = snap
        tmp = snap.with_name(f".tmp-{path.name}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            shutil.copytree(path, tmp, copy_function=_link_or_copy)
            os.replace(tmp, snap)
        except OSError as exc:
            log.warning("cannot snapshot %s (%s); uploading in place", path, exc)
            shutil.rmtree(tmp, ignore_errors=True)
            return path
        return snap

    def _heal_oom(self, ctx: Context, rc: int) -> bool:
        """The trainer died of CUDA out-of-memory: start it again from the newest checkpoint with
        the next rung of the ladder (oom.py). False: not healable here. The spent ladder ends the
        attempt with reason out-of-memory (the controller moves to an offer with more VRAM)."""
        seen = self.oom.seen
        self._submit_finished(ctx, exited=True, killed=True)
        done = self.trainer.finished(ctx, trainer_exited=True, killed=True)
        newest = max(done, key=lambda c: c.step) if done else None
        step = newest.step if newest else (ctx.resume_step if ctx.resume else 0)
        ev = self.healer.climb(seen, step=step, peak_gb=self.health.peak_mem_gb,
                               effective=self.oom.effective)
        if ev is None:
            self.worker.wait_idle(timeout=300)
            tried = ", ".join(self.healer.recipe.rungs) or "none applied"
            self.status.update(failure_cause="out-of-memory", oom_spent=True, oom_events=self.healer.events,
                               oom_retries=len(self.healer.events))
            tail = "\n".join(list(self.tail)[-15:])
            raise Failure(f"out-of-memory: the memory ladder is spent ({tried}); this run needs a GPU with "
                          f"more VRAM. The trainer exited with code {rc}; last output:\n{tail}")
        log.warning("CUDA out of memory (peak %s GB): restarting from step %d with rung %s: %s",
                    ev["peak_gb"], step, ev["rung"], ev["change"])
        self.status.update(oom_events=self.healer.events, oom_retries=len(self.healer.events), step=step)
        self.status.flush(ship_log=False)
        if newest is not None:
            ctx.resume, ctx.resume_step = self._set_aside(ctx, newest, done), newest.step
        ctx.trainer_args, recipe_env = self.healer.args()
        ctx.env.update(recipe_env)
        self.trainer = make_trainer(self.cfg.trainer)  # a fresh adapter: its step offsets follow the resume
        self.oom.reset()
        return True

    def _set_aside(self, ctx: Context, newest, done: list) -> Path:
        """The checkpoint to resume from, where a restored one would be (trainer.restore_dir), and
        the others out of the folder the trainer writes: a kohya script that counts its steps from 0
        again would otherwise write folders whose names mean other steps. All are durable or
        superseded (uploaded from their snapshots) before they move."""
        dest = self.trainer.restore_dir(ctx, newest.path.name)
        if dest.resolve() == newest.path.resolve():
            return newest.path  # diffusers: it resumes from the newest in its own folder
        self.worker.wait_idle(timeout=300)
        shutil.rmtree(dest, ignore_errors=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(newest.path, dest)
        aside = self.workdir / f"oom-{len(self.healer.events)}"
        for c in done:
            if c.path.exists():
                aside.mkdir(parents=True, exist_ok=True)
                os.replace(c.path, aside / c.path.name)
        return dest

    def _upload_artifacts(self, ctx: Context) -> int:
        files = self.trainer.artifacts(ctx)
        base = ctx.checkpoint_dir if self.cfg.trainer in ("diffusers", "kohya") else ctx.output_dir
        for p in files:
            key = f"{self.cfg.run_prefix}/artifacts/{p.relative_to(base).as_posix()}"
            retry(lambda: self.store.put_file(key, p), log=log.warning, what=f"upload of {key}")
        log.info("uploaded %d artifact files", len(files))
        return len(files)

    # -- the reclaim path -------------------------------------------------------------------
    def _handle_notice(self, ctx: Context, proc: subprocess.Popen) -> int:
        notice = self.notice
        assert notice is not None
        t0 = time.monotonic()
        left = lambda: notice.deadline - time.time()  # noqa: E731
        log.warning("reclaim notice (%s): %.0fs left; saving", notice.detail, left())
        self.status.set_phase("saving", notice.detail)
        self.worker.set_urgent()
        # The trainer gets the notice less a reserve for the final upload (at most 40% of it, so
        # that a short notice, as the local provider may give, still leaves time to save).
        reserve = min(self.cfg.upload_reserve_seconds, 0.4 * max(0.0, left()))
        end = t0 + max(1.0, left() - reserve)
        killed = False
        if proc.poll() is None:
            if not self.trainer.saves_on_sigterm:
                # It cannot save on demand: let it reach its next periodic checkpoint if that fits.
                self._await_next_checkpoint(ctx, proc, end - 5)
            self.trainer.request_stop(proc)
            while proc.poll() is None and time.monotonic() < end:
                self._submit_finished(ctx)
                time.sleep(0.1)
            if proc.poll() is None:
                log.warning("trainer did not stop in time: killing it")
                self.trainer.kill(proc)
                killed = True
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    log.error("trainer survived SIGKILL; uploading what is finished")
        # Exit 143 = it handled SIGTERM and saved; death by the signal itself (-15) may have cut a
        # save short, so only checkpoints that settled (or carry their trainer's marker) count.
        self._submit_finished(ctx, exited=True, killed=killed or proc.returncode not in (0, 143))
        self.status.set_phase("uploading", notice.detail)
        done = self.worker.wait_idle(timeout=max(1.0, left() - 2))
        durable = self.worker.durable_step
        secs = time.monotonic() - t0
        log.warning("notice_to_durable_s=%.2f durable_step=%d uploads_done=%s", secs, durable, done)
        self.status.update(step=max(durable, 0))
        self._set_cause("lifetime-cap" if getattr(self, "cap_reason", None) else "reclaim-notice")
        why = f"lifetime cap reached ({self.cap_reason})" if self.cap_reason else "spot reclaim"
        self.status.set_phase("preempted", f"{why}: newest durable checkpoint is step {durable}"
                              + ("" if done else " (an upload did not finish in time)"))
        return EXIT_PREEMPTED

    def _await_next_checkpoint(self, ctx: Context, proc: subprocess.Popen, until: float) -> None:
        it_s = self.status.state.get("it_per_s") or 0
        step = self.status.state.get("step") or 0
        nxt = (step // self.cfg.checkpoint_every + 1) * self.cfg.checkpoint_every
        if it_s <= 0 or (nxt - step) / it_s > until - time.monotonic():
            return
        log.info("waiting for the checkpoint at step %d (about %.0fs)", nxt, (nxt - step) / it_s)
        while proc.poll() is None and time.monotonic() < until:
            self._submit_finished(ctx)
            if any(c.step >= nxt for c in self.trainer.finished(ctx)):
                return
            time.sleep(0.2)

    # -- main -------------------------------------------------------------------------------
    def run(self) -> int:
        self._setup_logging()
        cfg = self.cfg
        log.info("sdcloud agent: run %s attempt %d, trainer %s, %d steps", cfg.run_id, cfg.attempt, cfg.trainer, cfg.steps)
        from .network import apply as apply_network
        for var, value in apply_network(cfg.network).items():  # before anything is fetched; trainers inherit it
            log.info("network: %s=%s", var, value)
        try:
            self.store = open_store(cfg.store)
            self.lease = Lease(self.store, cfg.run_prefix, cfg.attempt, ttl=max(10.0, 6 * cfg.heartbeat_seconds))
            self.lease.acquire()
        except LeaseHeld as exc:
            log.error("%s: leaving it alone (no checkpoint or status written)", exc)
            self._close_logging()
            return EXIT_LEASE_HELD
        except Exception as exc:  # noqa: BLE001
            return self._store_failed(exc)
        self.lease.start(max(1.0, cfg.heartbeat_seconds), self._lease_lost)
        self.phases = hostphases.AgentPhases(self.store, cfg)
        self.status = StatusReporter(self.store, cfg.run_prefix, cfg.run_id, cfg.attempt, cfg.steps,
                                     local_path=self.workdir / "status.json", log_path=self.log_path,
                                     extra=self._gauges)
        self.status.flush()
        self.status.start(cfg.heartbeat_seconds)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        watcher = make_watcher(cfg.metadata)
        watch = WatchThread(watcher, self._on_notice, cfg.poll_seconds).start() if watcher else None
        self._start_self_end_watch()
        sync = CheckpointSync(self.store, cfg.run_prefix, keep=cfg.keep_checkpoints, run=cfg.run_id,
                              attempt=cfg.attempt, trainer=cfg.trainer)
        self.worker = SyncWorker(sync)
        try:
            return self._run()
        except Failure as exc:
            log.error("failed: %s", exc)
            self._set_cause(exc.cause or (attempt_cause(exc.__cause__) if exc.__cause__ is not None else None)
                            or ("boot-failed" if exc.boot_phase else "agent-error"))
            if exc.boot_phase:
                self.status.update(boot_phase=exc.boot_phase)
                self.phases.failed(exc.boot_phase)
            self.status.set_phase("failed", str(exc))
            return EXIT_FAILED
        except Exception as exc:  # noqa: BLE001 - whatever happens, say so in status.json
            log.exception("agent crashed")
            self._set_cause(attempt_cause(exc))
            self.status.set_phase("failed", f"agent error: {type(exc).__name__}: {exc}")
            return EXIT_FAILED
        finally:
            if watch:
                watch.stop()
            self.worker.close()
            self.health.stop()
            self.status.stop()
            self.status.flush()
            self.lease.release()
            self._close_logging()

    def _set_cause(self, cause: str) -> None:
        """Why the attempt ended, unless a more precise cause was set first (out-of-memory)."""
        if not self.status.state.get("failure_cause"):
            self.status.update(failure_cause=cause)

    def _store_failed(self, exc: Exception) -> int:
        """The store could not be opened or refused the lease: say why, in one line, in the bucket's
        status.json when the store takes the write and in the host's own copy always (the local
        provider's controller reads it), then end the attempt. A refusal that recurs (a role without
        the grant, revoked keys, no bucket) ends the run after this attempt (docs/runs.md)."""
        cause = attempt_cause(exc)
        reason = f"the store refused this host ({cause}): {describe_failure(exc, self.cfg.store.get('url', ''))}"
        log.error("cannot open the store: %s", reason)
        print(f"sdcloud agent: {reason}", file=sys.stderr, flush=True)
        status = StatusReporter(self.store, self.cfg.run_prefix, self.cfg.run_id, self.cfg.attempt, self.cfg.steps,
                                local_path=self.workdir / "status.json", log_path=self.log_path)
        status.update(failure_cause=cause)
        status.set_phase("failed", reason)
        self.status = self.status or status
        return EXIT_FAILED

    def _close_logging(self) -> None:
        for h in self._handlers:
            logging.getLogger("sdcloud_agent").removeHandler(h)
            h.close()

    def _lease_lost(self) -> None:
        """A newer agent owns the run: stop the trainer and leave before another upload."""
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            self.trainer.kill(proc)
        # This host has nothing left to do: it ends itself (after the grace) rather than bill on.
        self.end_host(EXIT_LEASE_HELD, record=False)
        logging.shutdown()
        os._exit(EXIT_LEASE_HELD)

    # -- self-end (selfend.py) ------------------------------------------------------------------
    def _start_self_end_watch(self) -> None:
        """The controller's heartbeat (for `unattended`) and the lifetime cap, on a daemon thread."""
        se = self.self_end
        if se.provider == "none":
            return
        self.attendance = selfend.Attendance(self.store, self.cfg.run_prefix, se.unattended_after_s, time.time())
        if not se.ends_machine:  # the cap bounds a cloud bill: a box of the user's or this machine has none
            return
        cap, why = selfend.lifetime_cap(se)
        # Leave time to save and upload inside the cap: the notice's deadline is the cap itself.
        save_s = max(5.0, min(0.2 * cap, 300.0))
        start = se.launched_at if se.launched_at is not None else time.time()
        trigger = start + max(0.0, cap - save_s)
        log.info("lifetime cap: %.0fs from launch (%s)", cap, why)

        def watch() -> None:
            while time.time() < trigger:
                time.sleep(min(5.0, max(0.05, trigger - time.time())))
            if self.status is not None and self.status.phase in ("succeeded", "failed", "preempted"):
                return
            self.cap_reason = why
            log.warning("lifetime cap reached (%s): saving, uploading and ending this host", why)
            if self.status is not None:
                self.status.update(ended_by="lifetime-cap", cap=why)
            now = time.time()
            self._on_notice(Notice("terminate", now + save_s, now, f"lifetime cap reached ({why})"))

        threading.Thread(target=watch, name="sdcloud-lifetime-cap", daemon=True).start()

    def end_host(self, rc: int, record: bool = True) -> dict | None:
        """After the terminal phase: wait the grace for the controller (none when unattended or the
        cap was reached), record the end in status.json, end the host as its provider allows."""
        se = self.self_end
        if se.provider == "none":
            return None
        reason = selfend.REASONS.get(rc, f"agent exit {rc}")
        if self.cap_reason:
            reason = f"lifetime cap reached ({self.cap_reason})"
        elif self.status is not None and self.status.state.get("boot_phase"):
            reason = f"failed boot ({self.status.state['boot_phase']})"
        att = self.attendance or selfend.Attendance(self.store, self.cfg.run_prefix, se.unattended_after_s,
                                                    self._started_wall)
        return selfend.finish(se, self.store if record or rc != EXIT_LEASE_HELD else None, self.cfg.run_prefix,
                              self.cfg.attempt, reason, attendance=att, grace=self.cap_reason is None,
                              local_path=self.workdir / "status.json")

    def _run(self) -> int:
        cfg = self.cfg
        self._prepare_disk()
        self._check_gpu()
        ctx = Context(steps=cfg.steps, checkpoint_every=cfg.checkpoint_every, model=cfg.model, workdir=self.workdir,
                      checkpoint_dir=self.workdir / "checkpoints", output_dir=self.workdir / "output",
                      gpus=getattr(self, "gpu_count", 0))
        ctx.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.worker.sync.seed()
        # The checkpoint downloads while the model, the trainer's sources and the dataset are
        # staged: they are independent, and a resumed attempt's start-up is then the longest of
        # them rather than their sum. The restore writes into a temp folder renamed when whole,
        # so a staging failure below leaves nothing half-made for the trainer.
        restoring = _in_background(self._restore_newest, ctx, name="sdcloud-restore")
        # A cloud host stages the model from the bucket's cache (boot phase "model"); a model given
        # as a bucket URL (a folder or one .safetensors file) is then copied to local disk.
        ctx.model = self._stage_bucket_model(self._stage_model())
        if cfg.resolution_from_model:  # the tier's resolution is a fallback; the model's config decides
            from .resolution import settle
            cfg.trainer_args = settle(cfg.trainer, cfg.trainer_args, ctx.model)
        sources = self._stage_trainer_sources()
        ctx.dataset = self._stage()
        ctx.trainer_args = cfg.trainer_args  # after the model: the tiny model sets its resolution
        # The memory recipe an earlier attempt healed to after a CUDA out-of-memory (oom.py).
        self.healer = oomlib.Healer(cfg.trainer, ctx.trainer_args, store=self.store, run_prefix=cfg.run_prefix,
                                    python=sources.python if sources else None,
                                    cuda=bool(getattr(self, "gpu_count", 0)))
        ctx.trainer_args, recipe_env = self.healer.start()
        ctx.env.update(recipe_env)
        ctx.trainer_root = sources.tree if sources else None
        ctx.trainer_python = sources.python if sources else None
        self._restore(ctx, restoring)
        if self.notice_event.is_set():
            self._set_cause("lifetime-cap" if getattr(self, "cap_reason", None) else "reclaim-notice")
            self.status.set_phase("preempted", "spot reclaim before training started")
            return EXIT_PREEMPTED
        self.status.set_phase("training")
        self.health.start()
        while True:  # more than once only when a CUDA out-of-memory is healed on this host
            self.proc = proc = self._start_trainer(ctx)
            self.health.set_pid(proc.pid)
            while proc.poll() is None:
                self._submit_finished(ctx)
                if self.notice_event.wait(0.25):
                    return self._handle_notice(ctx, proc)
            rc = proc.wait()
            self._reader.join(timeout=5)  # its last lines (the failure's tail, the final step)
            if self.notice_event.is_set():
                return self._handle_notice(ctx, proc)
            if rc == 0 or self.oom.seen is None or not self._heal_oom(ctx, rc):
                break
        if rc != 0:
            self._submit_finished(ctx, exited=True, killed=True)
            self.worker.wait_idle(timeout=300)
            tail = "\n".join(list(self.tail)[-15:])
            raise Failure(f"trainer exited with code {rc}; last output:\n{tail}", cause="trainer-error")
        self._submit_finished(ctx, exited=True)
        missing = self.trainer.missing_output(ctx)
        if missing:
            # Its checkpoints are kept (uploaded above); the attempt failed: there is no model.
            self.worker.wait_idle(timeout=300)
            tail = "\n".join(list(self.tail)[-15:])
            raise Failure(f"{missing}; last output:\n{tail}")
        self.status.set_phase("uploading")
        while not self.worker.wait_idle(timeout=0.5):
            if self.notice_event.is_set():
                return self._handle_notice(ctx, proc)
        if self.worker.failed and max(self.worker.failed) > self.worker.durable_step:
            log.warning("checkpoint(s) %s could not be uploaded", self.worker.failed)
        try:
            self._upload_artifacts(ctx)
        except (StoreError, Cancelled, OSError) as exc:
            raise Failure(f"uploading the finished model failed: {exc}") from exc
        self.status.update(step=cfg.steps)
        self.status.set_phase("succeeded")
        log.info("run succeeded")
        return EXIT_SUCCEEDED


def _in_background(fn, *args, name: str) -> concurrent.futures.Future:
    """fn(*args) on a daemon thread; its result or exception through the future. Not a pool: a
    pool's threads are joined at exit, and an agent failing its staging must not wait for them."""
    fut: concurrent.futures.Future = concurrent.futures.Future()

    def target() -> None:
        if fut.set_running_or_notify_cancel():
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever takes the result
                fut.set_exception(exc)

    threading.Thread(target=target, name=name, daemon=True).start()
    return fut


def _load_prctl():
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()  # looked up before any fork: the child only makes the call


def _die_with_parent() -> None:
    """In the trainer's child process: take a SIGKILL when the agent dies, so that a killed agent
    (its own session is not signalled with it) never leaves a trainer holding the GPU."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _link_or_copy(src: str, dst: str) -> str:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst
