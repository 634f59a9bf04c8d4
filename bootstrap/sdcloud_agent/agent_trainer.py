"""The trainer as the agent's child: started in its own process group, its output read line by line
(progress, health, CUDA out-of-memory), its finished checkpoints snapshotted for upload, an
out-of-memory healed by a restart on the next rung, and its artifacts uploaded at the end. A part of
the Agent class (agent.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from .outcome import Failure
from .store import retry
from .trainers.base import Context, Trainer

log = logging.getLogger("sdcloud_agent")
trainer_log = logging.getLogger("sdcloud_agent.trainer")


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


class TrainerProcess:
    def _start_trainer(self, ctx: Context) -> subprocess.Popen:
        # A changed optimizer starts fresh from a checkpoint the old one saved (oom.py).
        ctx.fresh_optimizer = ctx.resume is not None and self.healer is not None \
            and self.healer.fresh_optimizer(ctx.resume_step)
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
        self._trainer_t0, self._startup_s = time.monotonic(), None  # start to first step (an OOM's cost)
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
            if self.metrics is not None:
                self.metrics.feed_line(line, prog)
            self.status.update(**prog)
            if prog.get("step") and getattr(self, "_startup_s", 0) is None:
                self._startup_s = time.monotonic() - self._trainer_t0
            if prog.get("step") and not self._first_step:
                self._first_step = True
                self.phases.first_step()
                # When this attempt first trained (the model loaded, a step done): the controller times
                # the boot and a reclaim's restart to here, not to the trainer's start.
                self.status.update(trained_at=round(time.time(), 3))
                if self._resumed_from is not None:
                    # From this agent's start to training again: the restore, the staging beside
                    # it and the trainer's own start-up (the boot report has the host's share).
                    secs = time.monotonic() - self._started
                    log.info("launch_to_resumed_s=%.1f (resumed from checkpoint %d)", secs, self._resumed_from)
                    self.status.update(resumed_after_s=round(secs, 1))

    def _submit_finished(self, ctx: Context, exited: bool = False, killed: bool = False) -> None:
        for c in self.trainer.finished(ctx, trainer_exited=exited, killed=killed):
            if c.step > self.worker.durable_step and c.path.resolve() != (ctx.resume.resolve() if ctx.resume else None):
                self.worker.submit(c.step, self._snapshot(c.step, c.path, self.trainer.export_files(ctx, c.step, c.path)))
        # Snapshots of durable (or superseded) checkpoints only hold disk space now.
        durable = self.worker.durable_step
        for step, snap in list(self._snaps.items()):
            if step <= durable and self.worker.idle():
                shutil.rmtree(snap, ignore_errors=True)
                del self._snaps[step]

    def _snapshot(self, step: int, path: Path, export: list[Path] = ()) -> Path:
        """Hard-link a finished checkpoint into a folder the trainer never touches, so that its
        clean-up of old checkpoints cannot pull files from under an upload. `export`: the model at this
        step that the trainer keeps beside the checkpoint (kohya's per-step LoRA file), linked into its
        export/ folder, where `sdcloud pull --step N` finds it."""
        snap = self.workdir / "snapshots" / path.name
        if snap.exists():
            return snap
        self._snaps[step] = snap
        tmp = snap.with_name(f".tmp-{path.name}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            shutil.copytree(path, tmp, copy_function=_link_or_copy)
            for f in export:
                (tmp / "export").mkdir(exist_ok=True)
                _link_or_copy(str(f), str(tmp / "export" / f.name))
            os.replace(tmp, snap)
        except OSError as exc:
            log.warning("cannot snapshot %s (%s); uploading in place", path, exc)
            shutil.rmtree(tmp, ignore_errors=True)
            return path
        return snap

    def _resume_newest(self, ctx: Context) -> int:
        """After the trainer stopped on purpose (a health action): resume from its newest finished
        checkpoint (uploaded first), with a fresh adapter; the step it resumes at."""
        self._submit_finished(ctx, exited=True, killed=True)
        done = self.trainer.finished(ctx, trainer_exited=True, killed=True)
        newest = max(done, key=lambda c: c.step) if done else None
        if newest is not None:
            ctx.resume, ctx.resume_step = self._set_aside(ctx, newest, done), newest.step
        self.trainer = make_trainer(self.cfg.trainer)
        self.oom.reset()
        return ctx.resume_step if ctx.resume is not None else 0

    def _heal_oom(self, ctx: Context, rc: int) -> bool:
        """The trainer died of CUDA out-of-memory: start it again from the newest checkpoint with
        the next rung of the ladder (oom.py). False: not healable here. The spent ladder ends the
        attempt with reason out-of-memory (the controller moves to an offer with more VRAM)."""
        seen = self.oom.seen
        self._submit_finished(ctx, exited=True, killed=True)
        done = self.trainer.finished(ctx, trainer_exited=True, killed=True)
        newest = max(done, key=lambda c: c.step) if done else None
        step = newest.step if newest else (ctx.resume_step if ctx.resume else 0)
        reached = int(self.status.state.get("step") or step)
        ev = self.healer.climb(seen, step=step, peak_gb=self.health.peak_mem_gb,
                               effective=self.oom.effective, checkpoint=newest is not None or ctx.resume is not None)
        if ev is not None:  # what it costs: a start-up like this trainer's own, and the steps done again
            step_s = self.health.summary().get("step_s") or 0.0
            ev["lost_s"] = round((getattr(self, "_startup_s", None) or 0.0) + max(0, reached - step) * step_s, 1)
        if ev is None:
            self.worker.wait_idle(timeout=300)
            tried = ", ".join(self.healer.recipe.rungs) or "none applied"
            tried += "".join(f"; {p['rung']} passed over: {p['why']}" for p in self.healer.passed)
            self.status.update(failure_cause="out-of-memory", oom_spent=True, oom_events=self.healer.events,
                               oom_retries=len(self.healer.events))
            tail = "\n".join(list(self.tail)[-15:])
            raise Failure(f"out-of-memory: the memory ladder is spent ({tried}); this run needs a GPU with "
                          f"more VRAM. The trainer exited with code {rc}; last output:\n{tail}")
        log.warning("CUDA out of memory (peak %s GB): restarting from step %d with rung %s: %s%s",
                    ev["peak_gb"], step, ev["rung"], ev["change"],
                    " (fresh optimizer: weights and step from the checkpoint)" if ev.get("fresh_optimizer") else "")
        for p in ev.get("passed_over", []):
            log.warning("rung %s passed over: %s", p["rung"], p["why"])
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
        aside = self.workdir / f"set-aside-{time.monotonic_ns()}"
        for c in done:
            if c.path.exists():
                aside.mkdir(parents=True, exist_ok=True)
                os.replace(c.path, aside / c.path.name)
        return dest

    def _checkpoint_extras(self, ctx: Context, step: int, folder: Path) -> None:
        """What goes up with checkpoint `step` before its manifest: the samples the trainer rendered
        for it (samples/<step>/NN.png and .json) and the trainer's own TensorBoard logs so far."""
        from . import metrics, samples

        if ctx.samples is not None:
            found = self.trainer.samples(ctx, folder, step)
            if found:
                n = samples.upload(self.store, self.cfg.run_prefix, found, ctx.samples, self.trainer.name)
                log.info("%d samples up with checkpoint %d (steps %s)", n, step, sorted({f.step for f in found}))
                if self.cfg.keep_sampled:  # a user picks a model by its samples: keep it while the run goes
                    self.worker.sync.keep_also.update(f.step for f in found)
        logs = self.trainer.log_dir(ctx)
        if logs is not None:
            metrics.upload_tree(self.store, logs, f"{self.cfg.run_prefix}/{metrics.TENSORBOARD}/{metrics.THEIRS}")

    def _upload_artifacts(self, ctx: Context) -> int:
        files = self.trainer.artifacts(ctx)
        base = ctx.checkpoint_dir if self.cfg.trainer in ("diffusers", "kohya") else ctx.output_dir
        for p in files:
            key = f"{self.cfg.run_prefix}/artifacts/{p.relative_to(base).as_posix()}"
            retry(lambda: self.store.put_file(key, p), log=log.warning, what=f"upload of {key}")
        log.info("uploaded %d artifact files", len(files))
        if ctx.samples is not None and self.trainer.samples_after_save:  # the last ones, rendered after the last save
            from . import samples

            found = self.trainer.samples(ctx, None, ctx.steps)
            retry(lambda: samples.upload(self.store, self.cfg.run_prefix, found, ctx.samples, self.trainer.name),
                  log=log.warning, what="upload of the last samples")
        logs = self.trainer.log_dir(ctx)
        if logs is not None:  # the trainer's own curves, whole at the end
            from . import metrics

            retry(lambda: metrics.upload_tree(self.store, logs, f"{self.cfg.run_prefix}/{metrics.TENSORBOARD}/{metrics.THEIRS}"),
                  log=log.warning, what="upload of the trainer's logs")
        return len(files)


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
