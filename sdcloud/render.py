"""Output helpers shared by the commands: JSON to stdout, tables through rich."""

from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Sequence


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]], caption: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, caption=caption, caption_justify="left")
    for col in columns:
        t.add_column(col, overflow="fold")
    for row in rows:
        t.add_row(*("" if v is None else str(v) for v in row))
    # Wide enough for the offers table when piped; a terminal keeps its own width.
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(t)


def note(message: str) -> None:
    """A line for the human on stderr, so that stdout stays parseable."""
    sys.stderr.write(message + "\n")
