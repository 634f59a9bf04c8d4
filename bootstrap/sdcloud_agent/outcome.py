"""How an attempt ends on this host: the agent's exit codes and the failure that carries its reason.

Below the agent and the pieces it is made of (agent_staging.py, agent_trainer.py, agent_reclaim.py),
which all end an attempt with these.
"""

from __future__ import annotations

EXIT_SUCCEEDED, EXIT_FAILED, EXIT_PREEMPTED = 0, 1, 3
# Another live agent holds the run: this one left without touching it.
EXIT_LEASE_HELD = 4


class Failure(Exception):
    """A run-ending problem with a reason for status.json. With `boot_phase` it is this host's
    problem (a GPU it cannot use, a model or dataset it cannot stage): the controller ends the
    attempt and tries another offer."""

    def __init__(self, reason: str, boot_phase: str | None = None, cause: str | None = None):
        super().__init__(reason)
        self.boot_phase = boot_phase
        self.cause = cause  # status.json's failure_cause (docs/runs.md, "Why an attempt ended")
