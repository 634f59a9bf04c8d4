"""How a run looks while it goes (`sdcloud up` in the foreground, `sdcloud watch`): events in plain
words at their own time, and the progress as a bar on a terminal or a line a minute in a pipe.

The words of each kind are `sdcloud.events.words`; the health kinds' are `health_view.plain`,
which knows the health figures. `plain()` asks the one or the other, so that `watch`, `logs` and
`status` tell an event the same way.
"""

from __future__ import annotations

import sys
import time

from .. import render
from ..events import ROUTINE, Kind, words
from ..runs.driving import health_view

# When output is not a terminal (a CI log), one progress line this often.
PIPE_PROGRESS_SECONDS = 60.0


def plain(kind: Kind | str, data: dict) -> str | None:
    """An event told in plain words, or None for events only -v shows."""
    if kind in health_view.KINDS:
        return health_view.plain(kind, data)
    return words(kind, data)


class ProgressView:
    """Shows a run as it goes: a rich progress bar on a terminal; otherwise one line per event and a
    progress line a minute, so that a CI log is never silent for hours. Events carry their own time."""

    def __init__(self, total: int, quiet: bool, clock=time.time):
        self.quiet = quiet or render.VERBOSITY < 0
        self.total = total
        self.clock = clock
        self.progress = None
        self.task = None
        self._last_line = 0.0
        if not self.quiet and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn("[bold]{task.fields[phase]:<10}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                                     TextColumn("cost ${task.fields[cost]:.4f}"), console=Console(stderr=True))
            self.task = self.progress.add_task("run", total=total, phase="starting", rate="", cost=0.0)
            self.progress.start()

    def _print(self, line: str) -> None:
        if self.progress is not None:
            self.progress.console.print(line, markup=False, highlight=False)
        else:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def __call__(self, kind: Kind | str, data: dict, at: float | None = None) -> None:
        if self.quiet:
            return
        if kind == Kind.PROGRESS:
            self._progress(data)
            return
        stamp = time.strftime("%H:%M:%S", time.localtime(at if at is not None else self.clock()))
        text = None if kind in ROUTINE else plain(kind, data)
        if render.VERBOSITY > 0 or text is None:
            detail = " ".join(f"{k}={v}" for k, v in data.items() if v is not None)
            if render.VERBOSITY > 0:
                self._print(f"[{stamp}] {kind} {detail}")
            return
        self._print(f"[{stamp}] {text}")

    def _progress(self, data: dict) -> None:
        rate = f"{data['it_per_s']:.2f} it/s" if data.get("it_per_s") else ""
        if self.progress is not None:
            self.progress.update(self.task, completed=data.get("step") or 0, phase=data.get("phase") or "",
                                 rate=rate, cost=data.get("cost") or 0.0)
        elif self.clock() - self._last_line >= PIPE_PROGRESS_SECONDS:
            self._last_line = self.clock()
            eta = ""
            if data.get("it_per_s") and data.get("step") is not None:
                left = max(0, (data.get("total") or self.total) - data["step"]) / data["it_per_s"]
                eta = f", about {left / 60:.0f} min left"
            self._print(f"[{time.strftime('%H:%M:%S', time.localtime(self.clock()))}] {data.get('phase') or ''} "
                        f"step {data.get('step')}/{data.get('total') or self.total}"
                        f"{', ' + rate if rate else ''}{eta}, ${data.get('cost') or 0:.4f} so far")

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
