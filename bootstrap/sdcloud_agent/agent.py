"""The host agent's lifecycle: NVMe, GPU check, staging, restore, train, sync, watch, report.

    starting -> staging -> restoring -> training -> (saving -> uploading) -> succeeded | failed | preempted

Exit codes: 0 succeeded, 3 preempted, 1 failed (outcome.py). The Agent is this module's order of
things (open the store, take the lease, stage beside the restore, train, upload, report) over its
parts: the staging phases (agent_staging.py), the trainer as a child process (agent_trainer.py)
and the reclaim path with the host's self-end (agent_reclaim.py).
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from . import gpu, manifest as mf, staging
from . import hostphases
from . import oom as oomlib
from . import health as healthlib
from .end_request import ENDED_BY, EndRequestWatcher
from .lease import Lease, LeaseHeld
from .outcome import EXIT_FAILED, EXIT_LEASE_HELD, EXIT_PREEMPTED, EXIT_SUCCEEDED, Failure
from . import selfend
from .config import AgentConfig
from .status import StatusReporter
from .store import Cancelled, StoreError, attempt_cause, describe_failure, open_store
from .metrics import MetricsStream
from .sync import CheckpointSync, SyncWorker
from .trainers.base import Context
from .agent_nodes import NodeGroup
from .agent_reclaim import ENDINGS, ReclaimPath
from .agent_staging import StagingPhases
from .agent_trainer import TrainerProcess, make_trainer
from .health_act import HealthActions
from .clouds import make_watcher
from .watchers import Notice, WatchThread

log = logging.getLogger("sdcloud_agent")

__all__ = ["EXIT_FAILED", "EXIT_LEASE_HELD", "EXIT_PREEMPTED", "EXIT_SUCCEEDED", "Agent", "Failure", "make_trainer"]
TAIL_LINES = 40


class Agent(StagingPhases, TrainerProcess, HealthActions, ReclaimPath, NodeGroup):
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
        self.metrics: MetricsStream | None = None  # the run's curves in its store (rank 0; metrics.py)

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

    def _restore_newest(self, ctx: Context) -> tuple[object, float]:
        """The newest checkpoint that restores whole, or None, and the seconds it took. Runs on a
        thread of its own beside the model, trainer and dataset staging (`_run`)."""
        t0 = time.monotonic()
        got = mf.restore_newest(self.store, self.cfg.run_prefix, lambda m: self.trainer.restore_dir(ctx, m.name),
                                log=log.warning)
        return got, time.monotonic() - t0

    def _carry_moved(self) -> None:
        """A run that moved here from another cloud: its checkpoint and inputs fetched into this
        cloud's store (the copy order the controller left, move_copy.py) before anything reads them.
        One host copies (rank 0); the others of a group wait for its order to be done, within a limit."""
        from . import move_copy

        try:
            if self.cfg.node_rank == 0:
                move_copy.fetch_ordered(self.store, self.cfg.run_prefix)
            else:
                move_copy.wait_until_carried(self.store, self.cfg.run_prefix)
        except StoreError as exc:  # the attempt ends; the next host sends only what is still missing
            raise Failure(f"the move's copy into this cloud's store failed: {exc}", cause=attempt_cause(exc)) from exc

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
            self.lease = self._make_lease(lambda: Lease(self.store, cfg.run_prefix, cfg.attempt,
                                                        ttl=max(10.0, 6 * cfg.heartbeat_seconds)))
            self.lease.acquire()
        except LeaseHeld as exc:
            log.error("%s: leaving it alone (no checkpoint or status written)", exc)
            self._close_logging()
            return EXIT_LEASE_HELD
        except Exception as exc:  # noqa: BLE001
            return self._store_failed(exc)
        self.lease.start(max(1.0, cfg.heartbeat_seconds), self._lease_lost)
        self.phases = hostphases.AgentPhases(self.store, cfg)
        self.status = StatusReporter(self.store, self.node_prefix, cfg.run_id, cfg.attempt, cfg.steps,
                                     local_path=self.workdir / "status.json", log_path=self.log_path,
                                     extra=self._gauges)
        self.status.flush()
        self.status.start(cfg.heartbeat_seconds)
        if self.leads:  # one stream a run: the group's other hosts train the same steps
            self.metrics = MetricsStream(self.store, cfg.run_prefix, cfg.attempt, interval=cfg.metrics_seconds,
                                         gpu=self.health.latest).start()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        watcher = make_watcher(cfg.metadata)
        watch = WatchThread(watcher, self._on_notice, cfg.poll_seconds).start() if watcher else None
        # A driver that cannot reach this host's instance asks it to save and end through the bucket.
        asked = WatchThread(EndRequestWatcher(self.store, cfg.run_prefix, cfg.attempt, self._asked_to_end),
                            self._on_notice, max(1.0, cfg.heartbeat_seconds)).start()
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
            asked.stop()
            self.worker.close()
            self.health.stop()
            if self.metrics is not None:
                self.metrics.close()  # the interval in flight, before the status says the attempt ended
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

    def _asked_to_end(self, doc: dict) -> None:
        """Its driver asked this host to end (end_request.py): status.json says so, not a reclaim."""
        if self.status is not None and self.status.state.get("ended_by") != ENDED_BY:
            self.status.update(ended_by=ENDED_BY, ended_why=str(doc.get("reason") or "stopped"))

    def _lease_lost(self) -> None:
        """A newer agent owns the run: stop the trainer and leave before another upload."""
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            self.trainer.kill(proc)
        # This host has nothing left to do: it ends itself (after the grace) rather than bill on.
        self.end_host(EXIT_LEASE_HELD, record=False)
        logging.shutdown()
        os._exit(EXIT_LEASE_HELD)

    def _run(self) -> int:
        cfg = self.cfg
        self._prepare_disk()
        self._check_gpu()
        ctx = Context(steps=cfg.steps, checkpoint_every=cfg.checkpoint_every, model=cfg.model, workdir=self.workdir,
                      checkpoint_dir=self.workdir / "checkpoints", output_dir=self.workdir / "output",
                      gpus=getattr(self, "gpu_count", 0))
        ctx.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        if cfg.samples.get("prompts"):
            from .samples import SampleSettings

            ctx.samples = SampleSettings.from_dict(cfg.samples)
        ctx.report_to = cfg.report_to
        if cfg.report_to == "wandb":  # the key reaches the trainer's environment only (never a log or a file)
            key = f"{cfg.run_prefix}/secrets/wandb-key"
            if self.store.head(key) is not None:
                ctx.env["WANDB_API_KEY"] = self.store.get(key).decode().strip()
        if self.leads:  # the samples and the trainer's logs go up with each checkpoint, before its manifest
            self.worker.sync.before_manifest = lambda step, folder: self._checkpoint_extras(ctx, step, folder)
            if cfg.keep_sampled and ctx.samples is not None:  # an earlier attempt's sampled checkpoints too
                from .samples import sampled_steps

                self.worker.sync.keep_also.update(sampled_steps(self.store, cfg.run_prefix))
        self.worker.sync.seed()
        self._carry_moved()
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
            cause = self._ending_cause()
            self._set_cause(cause)
            self.status.set_phase("preempted", f"{ENDINGS[cause][1]} before training started")
            return EXIT_PREEMPTED
        self._join_group(ctx)  # a multi-node group meets here (agent_nodes.py)
        self.status.set_phase("training")
        self.health.start()
        while True:  # more than once only when a CUDA out-of-memory is healed on this host
            self.proc = proc = self._start_trainer(ctx)
            self.health.set_pid(proc.pid)
            while proc.poll() is None:
                self._submit_finished(ctx)
                self._act_on_health(ctx, proc)  # a verdict's action stops the trainer for a restart
                if self.notice_event.wait(0.25):
                    return self._handle_notice(ctx, proc)
            rc = proc.wait()
            self.health.set_exit(rc)  # an exited trainer has no health verdict, only its exit
            self._reader.join(timeout=5)  # its last lines (the failure's tail, the final step)
            if self.notice_event.is_set():
                return self._handle_notice(ctx, proc)
            grouped = self._stopped_with_group(ctx, proc, rc)  # another node's notice stopped every node
            if grouped is not None:
                return grouped
            if self.oom.seen is None and self._restart_for_health(ctx, rc):
                continue
            if rc == 0 or self.oom.seen is None or not self._heal_oom(ctx, rc):
                break
        if rc != 0:
            self._submit_finished(ctx, exited=True, killed=True)
            self.worker.wait_idle(timeout=300)
            tail = "\n".join(list(self.tail)[-15:])
            raise Failure(f"trainer exited with code {rc}; last output:\n{tail}", cause="trainer-error")
        self._submit_finished(ctx, exited=True)
        if not self.leads:  # rank 0 writes the model; this host's part is done
            self.status.update(step=cfg.steps)
            self.status.set_phase("succeeded")
            return EXIT_SUCCEEDED
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


