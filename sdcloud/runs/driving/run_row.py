"""A run's row in state.db as one controller step sees it: read once when the step starts.

The controller (runs/driving/controller.py) and the helpers it holds used to read the row again
wherever they needed a field of it, nine times in one `drive` step. The step now reads it once;
the step's own writes go through `update`, which writes the row and keeps the step's copy current,
so that a later read in the same step sees them (the state `end_run` wrote, the step the host
reported). `fresh` reads it again where another process may have written it meanwhile (`down`
while the step decided); outside a step every `get` reads afresh.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..records.state import StateStore


class RunRow:
    """The row of run `run_id`, cached for the length of one step."""

    def __init__(self, state: StateStore, run_id: str):
        self.state, self.run_id = state, run_id
        self._row: dict | None = None

    @contextmanager
    def step(self) -> Iterator[dict]:
        """One step: the row read once at its start, dropped at its end (a step that raised included)."""
        self._row = self.state.get_run(self.run_id)
        try:
            yield self._row
        finally:
            self._row = None

    def get(self) -> dict:
        """The step's copy; outside a step, the row as state.db holds it now."""
        return self._row if self._row is not None else self.state.get_run(self.run_id)

    def fresh(self) -> dict:
        """The row read again (another process may have changed it); the step's copy becomes it."""
        row = self.state.get_run(self.run_id)
        if self._row is not None:
            self._row = row
        return row

    def update(self, **fields: Any) -> None:
        """Write `fields` to the row, and to the step's copy, so that the rest of the step sees them."""
        self.state.update_run(self.run_id, **fields)
        if self._row is not None:
            self._row.update(fields)
