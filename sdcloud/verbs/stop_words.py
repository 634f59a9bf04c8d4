"""A run's end as the user reads it: what stopped it, in words that match what happened, and the
command that continues it (docs/runs.md: every stop message ends with one).

The run's row keeps why it ended (`reason`, written by whoever ended it: `down`, Ctrl-C under `up`,
the budget, the host's lifetime cap, the host ending itself after its grace). `ended_line` turns
that into one sentence for `down`, `up`, `watch` and `status`. `host_line` says what the host's
own report adds, and nothing where the run's end already says it: a host stopped with its run
saves on that stop, which the agent cannot tell from a reclaim notice.
"""

from __future__ import annotations

from ..events import one_line
from ..offers.kinds import RunKind
from ..runs.records.run_state import RESUMABLE_RUN_STATES, RunState

# (words in the recorded reason, what happened), first match wins.
_CAUSES = (
    ("sdcloud down", "stopped by you (sdcloud down)"),
    ("interrupted", "interrupted (Ctrl-C)"),
    ("budget", "stopped at its budget"),
    ("lifetime cap", "stopped at the host's lifetime cap"),
    ("ended itself", "its host ended itself after the grace, with nobody driving the run"),
    ("reclaim", "reclaimed"),
)


def cause(reason: str | None, state: str) -> str:
    """What ended a stopped or failed run, from the reason its row records."""
    text = (reason or "").lower()
    for needle, words in _CAUSES:
        if needle in text:
            return words
    return "failed" if state == RunState.FAILED else "stopped"


def ended_line(run: dict) -> str | None:
    """One line for a training run that stopped or failed: what happened and the command that
    continues it; None for a run that is not over or has succeeded, and for batch jobs (a cancel
    is final: docs/batch.md)."""
    if RunKind.of(run) is RunKind.BATCH:
        return None
    state = run.get("state")
    if state not in RESUMABLE_RUN_STATES:
        return None
    rid = run.get("run") or run.get("id")
    name = run.get("name") or rid
    step = run.get("step")
    kept = f"; checkpoint kept at step {step}" if step else ""
    what = cause(run.get("reason"), state)
    if state == RunState.FAILED and what == "failed":
        what = f"failed ({one_line(run['reason'])})" if run.get("reason") else "failed"
    budget = " --budget USD" if what == "stopped at its budget" else ""
    return f"run {rid}: {what}{kept}; continue it with: sdcloud resume {name}{budget}"


def host_line(run: dict, self_end: dict) -> str | None:
    """What the host's report of ending itself adds to the run's end, or None when the run's own
    end already says what happened (the user stopped it, Ctrl-C, the budget, the cap)."""
    from ..runs.records.state import ACTIVE_RUN_STATES

    reason = run.get("reason") or ""
    if run.get("state") not in ACTIVE_RUN_STATES and "ended itself" not in reason:
        return None  # it saved and ended with the run, on the stop the run's end names
    return f"ended itself ({self_end.get('reason')}{', unattended' if self_end.get('unattended') else ''})"
