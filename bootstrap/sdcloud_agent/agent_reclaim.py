"""The reclaim path: a notice (the cloud's, the agent's own SIGTERM, or the lifetime cap) makes the
trainer save, the delta upload and the attempt end `preempted`; after the terminal phase the host
ends itself (selfend.py). A part of the Agent class (agent.py).
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time

from . import selfend
from .end_request import ENDED_BY
from .outcome import EXIT_LEASE_HELD, EXIT_PREEMPTED
from .trainers.base import Context
from .watchers import Notice

log = logging.getLogger("sdcloud_agent")

# Seconds we assume we have when the agent itself gets SIGTERM (systemd stop at host shutdown).
SIGTERM_GRACE_S = 90.0
SIGTERM_DETAIL = "agent got SIGTERM"
# Why a host saves and ends, by its cause (status.json's failure_cause): what its log says as the
# save starts, what its `preempted` phase says, and the reason its self-end records. Only a notice
# of the cloud's own (or the local provider's simulated one) is a reclaim: a SIGTERM is the host
# being shut down (its driver ended the instance: `sdcloud down`, a budget, a move), an end asked
# through the bucket is its driver's, the cap the host's own.
ENDINGS = {
    "reclaim-notice": ("reclaim notice", "spot reclaim", "saved after a reclaim notice"),
    "host-shutdown": ("the host is shutting down", "the host was shut down", "saved as the host was shut down"),
    "asked-to-end": ("asked to end", "asked to end by its driver", "saved and ended as its driver asked"),
    "lifetime-cap": ("lifetime cap reached", "lifetime cap reached", "lifetime cap reached"),
}


class ReclaimPath:
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
        self._on_notice(Notice("terminate", now + SIGTERM_GRACE_S, now, SIGTERM_DETAIL))

    def _ending_cause(self) -> str:
        """Why this host saves and ends (a key of ENDINGS), from the notice that came first."""
        if getattr(self, "cap_reason", None):
            return "lifetime-cap"
        if self.status is not None and self.status.state.get("ended_by") == ENDED_BY:
            return "asked-to-end"  # its driver asked (end_request.py): no reclaim
        notice = getattr(self, "notice", None)
        return "host-shutdown" if notice is not None and notice.detail == SIGTERM_DETAIL else "reclaim-notice"

    def _handle_notice(self, ctx: Context, proc: subprocess.Popen) -> int:
        notice = self.notice
        assert notice is not None
        t0 = time.monotonic()
        left = lambda: notice.deadline - time.time()  # noqa: E731
        cause = self._ending_cause()
        log.warning("%s (%s): %.0fs left; saving", ENDINGS[cause][0], notice.detail, left())
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
        done = self.worker.wait_newest(timeout=max(1.0, left() - 2))
        durable = self.worker.durable_step
        secs = time.monotonic() - t0
        # Then the older checkpoints the newest went ahead of, with their samples, while the notice lasts.
        done = self.worker.wait_idle(timeout=max(1.0, left() - 2)) and done
        log.warning("notice_to_durable_s=%.2f durable_step=%d uploads_done=%s", secs, durable, done)
        self.status.update(step=max(durable, 0))
        self._set_cause(cause)
        why = f"lifetime cap reached ({self.cap_reason})" if self.cap_reason else ENDINGS[cause][1]
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
        cause = self.status.state.get("failure_cause") if self.status is not None else None
        if rc == EXIT_PREEMPTED and cause in ENDINGS:
            reason = ENDINGS[cause][2]  # the words of what made it save: a reclaim only if it was one
        if self.cap_reason:
            reason = f"lifetime cap reached ({self.cap_reason})"
        elif self.status is not None and self.status.state.get("boot_phase"):
            reason = f"failed boot ({self.status.state['boot_phase']})"
        att = self.attendance or selfend.Attendance(self.store, self.cfg.run_prefix, se.unattended_after_s,
                                                    self._started_wall)
        return selfend.finish(se, self.store if record or rc != EXIT_LEASE_HELD else None, self.node_prefix,
                              self.cfg.attempt, reason, attendance=att, grace=self.cap_reason is None,
                              local_path=self.workdir / "status.json")
