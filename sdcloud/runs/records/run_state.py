"""Where a run or a batch job stands: its state, a named kind, with its final states named once.

Stored in the runs table as the plain word (a str-valued Enum), so that rows written before this type,
journals in a bucket and `status --json` read the same; a member compares equal to its word.
"""

from __future__ import annotations

from enum import StrEnum


class RunState(StrEnum):
    """A run's (or batch job's) state, as the runs table keeps it."""

    PENDING = "pending"  # made, nothing launched yet
    LAUNCHING = "launching"  # a host is being launched
    RUNNING = "running"  # a host works on it
    RECOVERING = "recovering"  # no host now: reclaimed, lost, or waiting for the policy's next launch
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    # Ended by `down` (or its budget, a host's lifetime cap): final for every driver, `sdcloud resume` takes it up.
    STOPPED = "stopped"
    CANCELLED = "cancelled"  # a batch job ended by `batch cancel` or `down`: nothing relaunches it

    @property
    def final(self) -> bool:
        return self in FINAL_RUN_STATES

    @property
    def active(self) -> bool:
        return self in ACTIVE_RUN_STATES

    @classmethod
    def of(cls, row: dict) -> "RunState":
        """The state of a row of the runs table (or a summary)."""
        return cls(row["state"])


ACTIVE_RUN_STATES = (RunState.PENDING, RunState.LAUNCHING, RunState.RUNNING, RunState.RECOVERING)
FINAL_RUN_STATES = (RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED, RunState.CANCELLED)
# A run ended here says how to carry on: `sdcloud resume` takes up a stopped or failed one.
RESUMABLE_RUN_STATES = (RunState.STOPPED, RunState.FAILED)
