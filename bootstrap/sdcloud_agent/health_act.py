"""Acting on a health verdict (health.py) on the host, once per cause, by restarting the trainer
from its newest checkpoint with a changed setup (the out-of-memory ladder's machinery, oom.py):

  io-bound    the dataset moves to the agent's working disk (the instance's NVMe when it has one)
              if it is elsewhere; the data loader gets more workers (up to the vCPUs) where the
              script has the flag; latents (and, where kohya allows it, the text encoders'
              outputs) are cached through the ladder's cache-latents rung. After the restart the
              run is judged again; still io-bound is said plainly with the measured read rate.
  save-bound  checkpoints are written to the working disk before their upload (where the agent
              always puts them; said so), and the save interval doubles, up to the user's bound
              (checkpoint_every_max, else 4x the run's interval) and never past the interval the
              reclaim risk needs (checkpoint_spacing.py: Young/Daly where a save cannot be durable
              within the reclaim notice).

Each action is one entry of status.json `health_actions` (the controller makes each an event):
the cause, the changes in words, the figures before, the figures after once judged again.
Throttling is not acted on here: moving off a throttled host is the controller's choice
(sdcloud/runs/driving/oom_move.py weighs it), since only it knows the offers.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .oom_rules import lookup

log = logging.getLogger("sdcloud_agent")

CAUSES = ("io-bound", "save-bound")
# Seconds of training judged before an action (a verdict over the monitor's whole window, two
# minutes at its default interval): a restart costs the trainer's start-up, so a passing stall
# does not buy one. SDCLOUD_HEALTH_ACT_AFTER overrides it (the tests' short runs).
ACT_AFTER_SECONDS = 120.0
INTERVAL_GROWTH = 2
DEFAULT_BOUND = 4  # without the user's bound, the interval grows to at most 4x the chosen one
# The figures kept as "before" and "after" of an action.
FIGURES = ("data_wait_pct", "gpu_util", "read_mb_s", "step_s", "save_pct", "throttle_pct")
# The data loader's worker flag of each external trainer, and its default when unset: kohya's
# --max_data_loader_n_workers (train_util: default 8), diffusers' --dataloader_num_workers (0).
WORKERS = {"kohya": ("max_data_loader_n_workers", 8), "diffusers": ("dataloader_num_workers", 0)}


@dataclass
class Plan:
    """What an action changes; empty `changes` with `why_not`: nothing could be changed."""
    cause: str
    changes: list[str] = field(default_factory=list)
    dataset: Path | None = None  # copy the dataset here and train from it
    flags: dict = field(default_factory=dict)  # trainer flags set over the current ones
    rung: str | None = None  # an out-of-memory ladder rung adopted (cache-latents)
    checkpoint_every: int | None = None
    why_not: str = ""

    @property
    def restarts(self) -> bool:
        return bool(self.dataset or self.flags or self.rung or self.checkpoint_every)


def _under(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def plan_io(trainer: str, args: Any, *, dataset: Path | None, fast_dir: Path, vcpus: int,
            options: dict | None, cache_change: str | None) -> Plan:
    """The io-bound action. `options`: the script's flags (None: unknown, all taken);
    `cache_change`: what the ladder's cache-latents rung would change (None: it cannot)."""
    p = Plan("io-bound")
    if dataset is not None and dataset.is_dir() and not _under(dataset, fast_dir):
        p.dataset = fast_dir / "dataset-local"
        p.changes.append(f"dataset copied from {dataset} to the working disk {fast_dir}")
    if trainer in WORKERS:
        flag, default = WORKERS[trainer]
        if options is None or f"--{flag}" in options:
            cur = lookup(args, flag)
            try:
                cur = default if cur is None or cur is True else int(cur)
            except (TypeError, ValueError):
                cur = default
            if cur < vcpus:
                p.flags[flag] = vcpus
                p.changes.append(f"data loader workers {cur} -> {vcpus} (the host's vCPUs)")
            if trainer == "kohya" and (options is None or "--persistent_data_loader_workers" in options) \
                    and lookup(args, "persistent_data_loader_workers") is not True and p.flags:
                p.flags["persistent_data_loader_workers"] = True  # not respawned every epoch
    if cache_change:
        p.rung = "cache-latents"
        p.changes.append(cache_change)
    if not p.changes:
        where = f"the dataset is on the working disk ({fast_dir})" if dataset is not None else "no dataset folder"
        p.why_not = (f"nothing left to change: {where}"
                     + ("; the builtin trainer encodes the dataset once and reads it from memory"
                        if trainer == "builtin" else ""))
    return p


def plan_save(*, every: int, bound: int | None, step_s: float | None, save_s: float | None,
              notice_s: float | None, mean_s: float | None, checkpoint_dir: Path, fast_dir: Path) -> Plan:
    """The save-bound action: the next save interval within the user's bound and the reclaim
    risk's (`save_s`: one save's seconds; `notice_s`, `mean_s`: the reclaim notice and the mean
    time between reclaims, None where unknown)."""
    from .checkpoint_spacing import checkpoint_every

    p = Plan("save-bound")
    where = "on the working disk" if _under(checkpoint_dir, fast_dir) else f"in {checkpoint_dir}"
    limit = bound if bound is not None else DEFAULT_BOUND * every
    reason = f"the user's bound of {limit} steps"
    risk = checkpoint_every(every=limit, step_s=step_s, save_s=save_s, notice_s=notice_s, mean_s=mean_s)
    if risk.every < limit:
        limit, reason = risk.every, f"the reclaim risk: {risk.why}"
    new = min(every * INTERVAL_GROWTH, limit)
    if new <= every:
        p.why_not = f"checkpoints already {where} before upload; the interval {every} cannot grow past {reason}"
        return p
    p.checkpoint_every = new
    p.changes += [f"checkpoints written {where} before upload",
                  f"save interval {every} -> {new} steps (bounded by {reason})"]
    return p


def copy_dataset(src: Path, dest: Path) -> Path:
    """The dataset's files under `dest` (a temp folder renamed when whole, so a failed copy leaves
    nothing half-made for the trainer)."""
    if dest.is_dir():
        return dest
    tmp = dest.with_name(f".tmp-{dest.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    os.replace(tmp, dest)
    return dest


def _act_after() -> float:
    try:
        return float(os.environ.get("SDCLOUD_HEALTH_ACT_AFTER") or ACT_AFTER_SECONDS)
    except ValueError:
        return ACT_AFTER_SECONDS


def figures(summary: dict) -> dict:
    return {k: summary.get(k) for k in FIGURES}


class HealthActions:
    """The Agent's part that acts on verdicts (a mixin of agent.Agent, like agent_trainer's)."""

    def _health_init(self) -> None:
        self.health_actions: list[dict] = []
        self._acted: set[str] = set()
        self._pending: Plan | None = None  # decided; the trainer is being stopped for it
        self._pending_durable = -1  # external trainers: stop once a newer checkpoint is durable

    def _act_on_health(self, ctx: Any, proc: Any) -> None:
        """Called while the trainer runs: decide an action on a fresh verdict (once per cause),
        stop the trainer for it, and judge again after one. Best effort: a failure here is logged
        and training goes on as it was."""
        if not hasattr(self, "_acted"):
            self._health_init()
        try:
            self._act(ctx, proc)
        except Exception as exc:  # noqa: BLE001 - acting on health must never end a run
            log.warning("acting on the health verdict failed: %s", exc)
            self._pending = None

    def _act(self, ctx: Any, proc: Any) -> None:
        if self._pending is not None:
            if not self.trainer.saves_on_sigterm and self.worker.durable_step <= self._pending_durable:
                return  # wait for the next periodic checkpoint: no work is thrown away
            if not getattr(self, "_health_stop_sent", False):
                self._health_stop_sent = True
                (self.trainer.request_stop if self.trainer.saves_on_sigterm else self.trainer.kill)(proc)
            return
        summary = self.health.summary()
        verdict = summary.get("verdict")
        last = self.health_actions[-1] if self.health_actions else None
        if last is not None and "after" not in last and verdict not in (None, "unknown"):
            last["after"] = figures(summary)
            last["after_verdict"] = verdict
            last["still"] = verdict == last["cause"]
            if last["still"]:
                log.warning("still %s after %s: data wait %s%%, reads %s MB/s", verdict, "; ".join(last["changes"])
                            or "no change", summary.get("data_wait_pct"), summary.get("read_mb_s"))
            self.status.update(health_actions=self.health_actions)
        if verdict not in CAUSES or verdict in self._acted or self.health.judged_s() < _act_after():
            return
        self._acted.add(verdict)
        plan = self._plan(verdict, ctx, summary)
        entry = {"n": len(self.health_actions) + 1, "cause": verdict, "changes": plan.changes,
                 "why_not": plan.why_not or None, "before": figures(summary)}
        entry["step"] = self.status.state.get("step")
        self.health_actions.append(entry)
        if not plan.restarts:
            entry["after"], entry["after_verdict"], entry["still"] = figures(summary), verdict, True
            log.warning("%s: %s; read rate %s MB/s", verdict, plan.why_not, summary.get("read_mb_s"))
        else:
            log.warning("%s: %s; restarting the trainer from its newest checkpoint", verdict, "; ".join(plan.changes))
            self._pending, self._pending_durable = plan, self.worker.durable_step
            self._health_stop_sent = False
        self.status.update(health_actions=self.health_actions)

    def _plan(self, verdict: str, ctx: Any, summary: dict) -> Plan:
        from . import oom

        if verdict == "io-bound":
            cache = None
            if self.healer is not None and "cache-latents" not in self.healer.recipe.rungs:
                got = self.healer.ladder._try("cache-latents", self.healer.recipe)
                cache = got[1] if got else None
            return plan_io(self.cfg.trainer, ctx.trainer_args, dataset=ctx.dataset, fast_dir=self.workdir,
                           vcpus=os.cpu_count() or 1, options=oom.script_options(self.cfg.trainer, ctx.trainer_args),
                           cache_change=cache)
        save_s = self.health.save_s / self.health.saves if self.health.saves else None
        return plan_save(every=ctx.checkpoint_every, bound=self.cfg.checkpoint_every_max, step_s=summary.get("step_s"),
                         save_s=save_s, notice_s=getattr(self.cfg, "reclaim_notice_seconds", None),
                         mean_s=getattr(self.cfg, "reclaim_mean_seconds", None),
                         checkpoint_dir=ctx.checkpoint_dir, fast_dir=self.workdir)

    def _restart_for_health(self, ctx: Any, rc: int) -> bool:
        """After the trainer stopped for an action: apply it and resume from the newest checkpoint.
        A trainer that finished (exit 0) before it was stopped is not started again."""
        plan = getattr(self, "_pending", None)
        if plan is None:
            return False
        self._pending = None
        if rc == 0:
            self.health_actions[-1]["why_not"] = "the trainer finished before the change"
            self.status.update(health_actions=self.health_actions)
            return False
        step = self._resume_newest(ctx)
        if plan.dataset is not None:
            try:
                ctx.dataset = copy_dataset(ctx.dataset, plan.dataset)
            except OSError as exc:  # a full disk: train on from where the data was
                log.warning("cannot copy the dataset to %s (%s); it stays where it is", plan.dataset, exc)
                self.health_actions[-1]["why_not"] = f"the dataset could not be copied: {exc}"
        if plan.rung is not None and self.healer is not None:
            self.healer.adopt(plan.rung)
            ctx.trainer_args, recipe_env = self.healer.args()
            ctx.env.update(recipe_env)
        if plan.flags:
            self.healer.extra_flags.update(plan.flags)
            ctx.trainer_args, _ = self.healer.args()
        if plan.checkpoint_every:
            ctx.checkpoint_every = plan.checkpoint_every
        self.health_actions[-1]["resume_step"] = step
        self.status.update(health_actions=self.health_actions, step=step)
        self.health.reset()
        log.info("restarting the trainer from step %d for %s", step, plan.cause)
        return True
