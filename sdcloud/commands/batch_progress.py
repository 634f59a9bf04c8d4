"""A batch job's progress as the user watches it: a rich bar on a terminal, a line per change elsewhere
(`batch submit` in the foreground, `batch watch`)."""

from __future__ import annotations

import sys

from ..render import note


class BatchProgress:
    """A rich progress bar on a terminal (images, images/s, ETA, cost); one line per change otherwise."""

    def __init__(self, total: int, quiet: bool = False):
        self.quiet, self.bar, self.last = quiet, None, None
        if not quiet and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("[bold]images"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[rate]} img/s"), TimeRemainingColumn(),
                                TextColumn("cost ${task.fields[cost]:.4f}"), console=Console(stderr=True))
            self.task = self.bar.add_task("batch", total=total, rate="0", cost=0.0)
            self.bar.start()

    def __call__(self, p: dict) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=p["images_done"], rate=f"{p['images_per_s']:.2f}",
                            cost=p.get("cost_usd") or 0.0)
        elif not self.quiet and p["images_done"] != self.last:
            eta = "ETA unknown" if p.get("eta_s") is None else f"ETA {p['eta_s']:.0f} s"
            note(f"{p['images_done']}/{p['images']} images, {p['images_per_s']} images/s, {eta}, "
                 f"cost ${p.get('cost_usd') or 0:.4f}")
        self.last = p["images_done"]

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
