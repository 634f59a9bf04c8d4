"""Moving a run off a host that cannot serve it: out of GPU memory with the memory ladder spent
(sdcloud_agent/oom.py), or a GPU that throttles for a sustained share of the time (weigh_throttle).

The agent heals a CUDA out-of-memory on the host, rung by rung; when no rung is left it ends the
attempt with `failure_cause: out-of-memory`. The same GPU would fail the same way, so the
controller cools that offer down, keeps only the candidates with more usable VRAM per GPU, and
launches the next attempt there (it resumes from the newest checkpoint with the recipe the ladder
reached, kept in the run's prefix). With no bigger GPU among the candidates the run ends.
"""

from __future__ import annotations

from typing import Any

from ...events import Kind
from ...fleet.candidates import attempt_zone_key, vram_of, with_more_vram
from ...providers.traits import Hosts, traits
from ..records.run_state import RunState
from .owner import RunOwner

OOM_CAUSE = "out-of-memory"


def is_out_of_memory(status: dict | None) -> bool:
    return bool(status and status.get("phase") == "failed" and status.get("failure_cause") == OOM_CAUSE)


def oom_events(controller: RunOwner, attempt: int, status: dict | None) -> None:
    """One `oom-retry` event per rung the agent climbed (status.json `oom_events`), each once."""
    seen = controller.memo.oom_seen
    for ev in (status or {}).get("oom_events") or []:
        key = (attempt, ev.get("n"))
        if key not in seen:
            seen.add(key)
            controller.event(Kind.OOM_RETRY, {"attempt": attempt, **{k: ev.get(k) for k in
                                                                     ("n", "rung", "change", "peak_gb", "resume_step",
                                                                      "lost_s")}})


def on_out_of_memory(ctrl: RunOwner, cur: Any, status: dict) -> None:
    key = attempt_zone_key(cur.provider, cur.region, cur.zone, cur.instance_type)
    have = vram_of(ctrl.fleet.candidates, key)
    oom_events(ctrl, cur.n, status)
    ctrl.end_attempt(cur, OOM_CAUSE)
    ctrl.fleet.cool_down(key, OOM_CAUSE)
    bigger = with_more_vram(ctrl.fleet.candidates, have) if have is not None else []
    ctrl.event(Kind.OUT_OF_MEMORY, {"attempt": cur.n, "offer": key, "vram_mib": have,
                                    "rungs": [e.get("rung") for e in status.get("oom_events") or []],
                                    "next": [f"{o.row.instance_type} ({o.row.usable_vram_mib} MiB)" for o in bigger][:4]})
    if not bigger:
        ctrl.end_run(RunState.FAILED, f"out of GPU memory on {cur.instance_type} with every rung of the memory ladder, "
                                "and no candidate offer has more VRAM; pick a tier with a bigger GPU")
        return
    ctrl.fleet.candidates = bigger
    ctrl.set_state(RunState.RECOVERING)


# ---------------------------------------------------------------------------------------------
# A host whose GPU throttles for a sustained share of the time: move, or say why not.

# A slowdown reason active in at least this share of the GPU samples, over at least this many
# samples (a minute at the agent's 5 s interval), is sustained enough to weigh a move.
THROTTLE_SUSTAINED_PCT = 50.0
THROTTLE_MIN_SAMPLES = 12
# What a move costs before training again: a cloud host's boot, staging and restore (docs/training.md
# has the measured figures; the agent's resumed_after_s replaces it once a resume was measured).
MOVE_RESTART_S = 300.0
MOVE_MARGIN = 0.10  # the move must save at least this share of the time left to be worth the risk
THROTTLE_CAUSE = "throttled"


def weigh_throttle(ctrl: RunOwner, cur: Any, status: dict | None, *, total_steps: int,
                   every: int | None = None) -> bool:
    """Weigh moving a throttled run to a fresh host, once per attempt: the time left here at the
    throttled pace against a restart (boot, restore, the work since the last checkpoint) plus the
    time left at the catalog pace (the GPU's full clock). Acts (ends the attempt, cools the offer
    down so the next launch avoids it) or says why not; one `throttle-move` event either way.
    True when the attempt was ended."""
    h = (status or {}).get("health") or {}
    if h.get("verdict") != THROTTLE_CAUSE or (h.get("throttle_pct") or 0) < THROTTLE_SUSTAINED_PCT \
            or (h.get("gpu_samples") or 0) < THROTTLE_MIN_SAMPLES or cur.n in ctrl.memo.throttle_weighed:
        return False
    ctrl.memo.throttle_weighed.add(cur.n)
    key = attempt_zone_key(cur.provider, cur.region, cur.zone, cur.instance_type)
    ev = {"attempt": cur.n, "offer": key, "throttle_pct": h.get("throttle_pct"),
          "reasons": h.get("throttle_reasons") or [], "sm_clock_pct": h.get("sm_clock_pct"), "moved": False}
    step, step_s, clock = int((status or {}).get("step") or 0), h.get("step_s"), h.get("sm_clock_pct")
    cloud = traits(cur.provider).hosts is Hosts.CLOUD  # spot or on-demand: another host can be had
    decision = decide_move(total_steps - step, step_s, clock, cloud=cloud,
                           restart_s=(status or {}).get("resumed_after_s") or MOVE_RESTART_S,
                           lost_steps=(every or 0) / 2, price=cur.price)
    ev.update(decision)
    if decision["moved"]:
        ctrl.fleet.cool_down(key, THROTTLE_CAUSE)
        ctrl.event(Kind.THROTTLE_MOVE, ev)
        ctrl.end_attempt(cur, THROTTLE_CAUSE)
        ctrl.set_state(RunState.RECOVERING)
        return True
    ctrl.event(Kind.THROTTLE_MOVE, ev)
    return False


def decide_move(remaining_steps: int, step_s: float | None, sm_clock_pct: float | None, *, cloud: bool,
                restart_s: float, lost_steps: float, price: float | None) -> dict:
    """{"moved", "why", "stay_min", "move_min", "stay_cost", "move_cost"}: the figures of the choice."""
    out: dict = {"moved": False, "stay_min": None, "move_min": None, "stay_cost": None, "move_cost": None}
    if not cloud:
        return {**out, "why": "a host of the user's: no other host to move to"}
    if not step_s or not sm_clock_pct or remaining_steps <= 0:
        return {**out, "why": "the step time or the SM clock was not measured: nothing to weigh"}
    fresh_s = step_s * min(1.0, sm_clock_pct / 100.0)  # the catalog pace: the same GPU at its full clock
    stay = remaining_steps * step_s
    move = restart_s + (remaining_steps + lost_steps) * fresh_s
    out.update(stay_min=round(stay / 60, 1), move_min=round(move / 60, 1))
    if price is not None:
        out.update(stay_cost=round(stay / 3600 * price, 4), move_cost=round(move / 3600 * price, 4))
    if move <= stay * (1 - MOVE_MARGIN):
        return {**out, "moved": True, "why": f"a fresh host finishes in {out['move_min']} min against "
                                               f"{out['stay_min']} min here at the throttled pace"}
    return {**out, "why": f"staying: {out['stay_min']} min here at the throttled pace against {out['move_min']} min "
                          f"with a restart of {restart_s / 60:.0f} min on a fresh host"}
