"""A running job replans on what it measures.

The catalog's rate (or the book's) plans a run before it starts. Once an attempt is warm (observe.
WARM_STEPS past its first step), the work left is the steps left at that attempt's measured rate,
and the spot policy sees that: a host slower than the catalog says leaves less slack, so the policy
goes on-demand in time for the deadline; a faster one leaves more. The newest warm attempt stands
for the hosts to come (they are of the same offers), so a run just reclaimed still plans on it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

from .observe import steady_rate

# A fleet Progress (sdcloud/fleet/lifecycle.py): anything with done_hours and job_hours fields.
P = TypeVar("P")


def measured_rate(state, run_id: str) -> tuple[int, float] | None:
    """(attempt, steps/s) of the newest warm attempt of the run; None before any is warm."""
    costs = state.attempt_costs(run_id)
    for n in sorted(costs, reverse=True):
        rate = steady_rate(costs[n])
        if rate:
            return n, rate
    return None


def replanned(progress: P, rate: float | None, step: int, total_steps: int) -> P:
    """`progress` with the work left at `rate` steps/s (None: as planned).

    The policy's units stay hours: what is done keeps its planned hours, and the job's hours become
    those plus the steps left at the measured rate."""
    if not rate or rate <= 0 or total_steps <= 0:
        return progress
    left = max(0, total_steps - step) / rate / 3600.0
    return replace(progress, job_hours=progress.done_hours + left)  # type: ignore[type-var, attr-defined]
