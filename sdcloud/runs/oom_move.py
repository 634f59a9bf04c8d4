"""A host whose agent spent its memory ladder (sdcloud_agent/oom.py): the run moves to more VRAM.

The agent heals a CUDA out-of-memory on the host, rung by rung; when no rung is left it ends the
attempt with `failure_cause: out-of-memory`. The same GPU would fail the same way, so the
controller cools that offer down, keeps only the candidates with more usable VRAM per GPU, and
launches the next attempt there (it resumes from the newest checkpoint with the recipe the ladder
reached, kept in the run's prefix). With no bigger GPU among the candidates the run ends.
"""

from __future__ import annotations

from typing import Any

from ..events import Kind
from ..fleet.candidates import attempt_zone_key, vram_of, with_more_vram
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
                                                                     ("n", "rung", "change", "peak_gb", "resume_step")}})


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
        ctrl.end_run("failed", f"out of GPU memory on {cur.instance_type} with every rung of the memory ladder, "
                                "and no candidate offer has more VRAM; pick a tier with a bigger GPU")
        return
    ctrl.fleet.candidates = bigger
    ctrl.state.update_run(ctrl.run_id, state="recovering")
