"""Output helpers shared by the commands: JSON to stdout, tables through rich, notes on stderr.

Tables fit the terminal without folding what a user copies: identifiers and figures never wrap.
Columns that are empty are left out, and when the table is still too wide the columns a command
names as lesser give way first (`drop`, lesser first). `--wide` keeps every column.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Iterable, Sequence

# Set by --wide (commands that show tables), -q and -v (every command).
WIDE = False
VERBOSITY = 0  # -1 quiet, 0 normal, 1 verbose
# Width used when output is not a terminal and COLUMNS is unset (a pipe or a CI log).
PIPE_WIDTH = 200
# A wrapping column (a description) is counted at this width when checking whether a table fits.
WRAP_MIN = 24


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def console(stderr: bool = False):
    from rich.console import Console

    c = Console(stderr=stderr)
    if not c.is_terminal and not os.environ.get("COLUMNS"):
        c = Console(stderr=stderr, width=PIPE_WIDTH)
    return c


def table_width(columns: Sequence[str], rows: list[list[str]], keep: Sequence[int], wrap: Sequence[str] = ()) -> int:
    """Characters a rich table with these columns needs when nothing but the `wrap` columns may wrap."""
    total = 1
    for i in keep:
        natural = max([len(columns[i])] + [len(r[i]) for r in rows])
        total += (min(natural, WRAP_MIN) if columns[i] in wrap else natural) + 3
    return total


def fit_columns(columns: Sequence[str], rows: list[list[str]], width: int, drop: Sequence[str] = (),
                wrap: Sequence[str] = (), wide: bool = False) -> list[int]:
    """Indexes of the columns to show: non-empty ones, less the lesser ones until the table fits."""
    keep = [i for i, _ in enumerate(columns) if any(r[i] for r in rows)] or list(range(len(columns)))

    def need(idx: list[int]) -> int:
        return table_width(columns, rows, idx, wrap)

    if not wide:
        for name in drop:
            if need(keep) <= width:
                break
            keep = [i for i in keep if columns[i] != name]
    return keep


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]], caption: str | None = None,
          *, drop: Sequence[str] = (), wrap: Sequence[str] = ()) -> None:
    """Print a table. `drop`: columns that give way when it is too wide, lesser first; `wrap`: columns
    (descriptions) that may wrap. Every other column is shown whole."""
    from rich.table import Table

    out = console()
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    keep = fit_columns(columns, cells, out.width, drop, wrap, WIDE)
    t = Table(title=title, caption=caption, caption_justify="left")
    for i in keep:
        t.add_column(columns[i], no_wrap=columns[i] not in wrap, overflow="fold" if columns[i] in wrap else "ignore")
    for row in cells:
        t.add_row(*(row[i] for i in keep))
    needed = table_width(columns, cells, keep, wrap)
    if needed > out.width:
        # Still wider than the terminal: let the line run on rather than cut an identifier.
        from rich.console import Console

        out = Console(width=needed, force_terminal=out.is_terminal, no_color=out.no_color)
    out.print(t)


def note(message: str) -> None:
    """A line for the human on stderr, so that stdout stays parseable (-q silences it)."""
    if VERBOSITY >= 0:
        sys.stderr.write(message + "\n")


def verbose(message: str) -> None:
    """Detail for -v only (key=value event lines and the like)."""
    if VERBOSITY > 0:
        sys.stderr.write(message + "\n")


def output_options(f):
    """-q/--quiet and -v/--verbose on a command (they set VERBOSITY before the command runs)."""
    import click

    def set_quiet(ctx, param, value):
        global VERBOSITY
        if value:
            VERBOSITY = -1

    def set_verbose(ctx, param, value):
        global VERBOSITY
        if value:
            VERBOSITY = max(VERBOSITY, 0) + value

    f = click.option("-q", "--quiet", is_flag=True, expose_value=False, is_eager=True, callback=set_quiet,
                     help="Print only the result (no notes or progress).")(f)
    f = click.option("-v", "--verbose", count=True, expose_value=False, is_eager=True, callback=set_verbose,
                     help="Print more detail (every event as key=value).")(f)
    return f


def wide_option(f):
    import click

    def set_wide(ctx, param, value):
        global WIDE
        WIDE = bool(value)

    return click.option("--wide", is_flag=True, expose_value=False, callback=set_wide,
                        help="Show every column, however wide the table gets.")(f)
