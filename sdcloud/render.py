"""Output helpers shared by the commands: JSON to stdout, tables through rich, notes on stderr.

Tables fit the terminal without folding what a user copies: identifiers and figures never wrap.
Columns that are empty are left out; when the table is still too wide the columns a command names
as lesser give way first (`drop`, lesser first), then descriptions wrap down to their longest word,
then columns give way from the right. One line under the table names what was left out, and
`--wide` keeps every column. Long lines of human output (`echo`) and warnings (`note(wrap=True)`)
wrap between words, so the terminal never cuts a word at its edge.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Iterable, Sequence

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


def _cell_min(text: str) -> int:
    """The narrowest a wrapping cell can be without cutting a word: its longest word."""
    return max((len(w) for w in text.split()), default=0)


def _natural(columns: Sequence[str], rows: list[list[str]], i: int) -> int:
    return max([len(columns[i])] + [len(r[i]) for r in rows])


def _least(columns: Sequence[str], rows: list[list[str]], i: int, wrap: Sequence[str], fold: Sequence[str],
           tight: bool) -> int:
    """The width column i is counted at when checking whether a table fits.

    A `wrap` column wraps at spaces only, so it needs its longest word at least, and WRAP_MIN unless
    `tight`; a `fold` column (a value such as a path) may also cut a long word, and needs WRAP_MIN;
    any other column needs its widest cell."""
    natural = _natural(columns, rows, i)
    if columns[i] in fold:
        return min(natural, WRAP_MIN)
    if columns[i] in wrap:
        word = max([_cell_min(columns[i])] + [_cell_min(r[i]) for r in rows])
        return min(natural, word if tight else max(WRAP_MIN, word))
    return natural


def table_width(columns: Sequence[str], rows: list[list[str]], keep: Sequence[int], wrap: Sequence[str] = (),
                tight: bool = False, fold: Sequence[str] = ()) -> int:
    """Characters a rich table with these columns needs when nothing but the `wrap` and `fold`
    columns may wrap (see _least)."""
    return 1 + sum(_least(columns, rows, i, wrap, fold, tight) + 3 for i in keep)


def fit_columns(columns: Sequence[str], rows: list[list[str]], width: int, drop: Sequence[str] = (),
                wrap: Sequence[str] = (), wide: bool = False, fold: Sequence[str] = ()) -> list[int]:
    """Indexes of the columns to show: non-empty ones, less the lesser ones until the table fits.

    The `drop` columns give way first, in their order. If the table is still too wide, the wrapping
    columns may wrap down to their longest word, and then the other columns give way from the right
    (never the first, which names the row). Last, unless cells had to wrap that far, the dropped
    columns that fit again come back, the most important first, so that no room is left unused."""
    keep = [i for i, _ in enumerate(columns) if any(r[i] for r in rows)] or list(range(len(columns)))
    if wide:
        return keep
    tight = False

    def need(idx: list[int]) -> int:
        return table_width(columns, rows, idx, wrap, tight, fold)

    dropped: list[int] = []
    for name in drop:
        if need(keep) <= width:
            break
        i = columns.index(name) if name in columns else -1
        if i in keep and len(keep) > 1:
            keep = [k for k in keep if k != i]
            dropped.append(i)
    if need(keep) > width:
        tight = True
    for i in reversed(keep[1:]):
        if need(keep) <= width:
            break
        keep = [k for k in keep if k != i]
        dropped.append(i)
    for i in reversed(dropped if not tight else []):
        trial = sorted(keep + [i])
        if need(trial) <= width:
            keep = trial
    return keep


def _wrap_widths(columns: Sequence[str], rows: list[list[str]], keep: Sequence[int], wrap: Sequence[str],
                 fold: Sequence[str], width: int) -> dict[int, int]:
    """Widths for the wrapping columns when the table must wrap some cells to fit: each gets at least
    its least width (rich would otherwise shrink a column below its longest word and cut it), and
    the room left is shared in proportion to what each would need to show its cells on one line."""
    wrapping = [i for i in keep if columns[i] in wrap or columns[i] in fold]
    natural = {i: _natural(columns, rows, i) for i in keep}
    room = width - 1 - 3 * len(keep) - sum(natural[i] for i in keep if i not in wrapping)
    if not wrapping or sum(natural[i] for i in wrapping) <= room:
        return {}
    least = {i: _least(columns, rows, i, wrap, fold, True) for i in wrapping}
    spare = max(0, room - sum(least.values()))
    want = {i: natural[i] - least[i] for i in wrapping}
    total_want = sum(want.values()) or 1
    return {i: least[i] + (spare * want[i]) // total_want for i in wrapping}


def hidden_note(hidden: Sequence[str]) -> str:
    """The line under a table that had to leave columns out."""
    return f"hidden to fit: {', '.join(hidden)}; --wide shows them"


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]],
          caption: str | Callable[[set[str]], str] | None = None, *, drop: Sequence[str] = (), wrap: Sequence[str] = (),
          fold: Sequence[str] = (), note_hidden: bool = True, empty: str | None = None) -> list[str]:
    """Print a table; return the names of the columns left out to fit.

    `empty`: the line printed instead of a table with no rows (what there is none of, and how to make one).
    `drop`: columns that give way when it is too wide, lesser first (others follow from the right);
    `wrap`: columns (descriptions) that may wrap at spaces; `fold`: columns of long values (paths)
    that may also be cut inside a word. Every other column is shown whole.
    `caption`: text under the table, or a function of the shown column names (so that it explains
    only what is shown). Unless `note_hidden` is false, a line names the columns left out and --wide."""
    from rich.table import Table

    out = console()
    from .names import strip_controls

    # A cell may hold what a user typed (a job's name, a note): no control character reaches the terminal.
    cells = [["" if v is None else strip_controls(str(v)) for v in row] for row in rows]
    if not cells and empty:
        echo(empty)
        return []
    keep = fit_columns(columns, cells, out.width, drop, wrap, WIDE, fold)
    shown = [columns[i] for i in keep]
    candidates = [i for i, _ in enumerate(columns) if any(r[i] for r in cells)] or range(len(columns))
    hidden = [columns[i] for i in candidates if i not in keep]
    if callable(caption):
        caption = caption(set(shown))
    if table_width(columns, cells, keep, wrap, True, fold) > out.width:
        # Still wider than the terminal (--wide, or one column alone is): let the line run on rather
        # than cut an identifier, with descriptions at their usual width.
        from rich.console import Console

        out = Console(width=table_width(columns, cells, keep, wrap, False, fold), force_terminal=out.is_terminal,
                      no_color=out.no_color)
    widths = _wrap_widths(columns, cells, keep, wrap, fold, out.width)
    t = Table(title=title, caption=caption, caption_justify="left")
    for i in keep:
        wraps = columns[i] in wrap or columns[i] in fold
        t.add_column(columns[i], no_wrap=not wraps, overflow="fold" if wraps else "ignore", width=widths.get(i))
    for row in cells:
        t.add_row(*(row[i] for i in keep))
    out.print(t)
    if hidden and note_hidden:
        echo(hidden_note(hidden))
    return hidden


def wrap_text(text: str, width: int, indent: str = "  ") -> list[str]:
    """Lines of at most `width` characters, broken between "; "-separated parts where it can, else at
    spaces; never inside a word (a word longer than the line gets a line of its own). Lines after
    the first are indented, so that a wrapped message reads as one."""
    import textwrap

    if width <= 0 or len(text) <= width:
        return [text]
    parts = text.split("; ")
    tokens = [p + ";" for p in parts[:-1]] + [parts[-1]]
    lines: list[str] = []
    line = ""
    for tok in tokens:
        candidate = f"{line} {tok}" if line.strip() else line + tok
        if len(candidate) <= width:
            line = candidate
            continue
        if line.strip():
            lines.append(line)
        line = (indent if lines else "") + tok
        if len(line) > width:
            pieces = textwrap.wrap(" ".join(_split_path(w, width - len(indent)) for w in line.split(" ")),
                                   width=width, subsequent_indent=indent, break_long_words=False,
                                   break_on_hyphens=False)
            lines.extend(pieces[:-1])
            line = pieces[-1]
    if line.strip():
        lines.append(line)
    return lines


def _split_path(word: str, width: int) -> str:
    """A path or URL longer than a line, broken after a '/' into pieces that fit (spaces between
    them, for the wrapper to break at); any other word is left whole."""
    if len(word) <= width or "/" not in word or width <= 0:
        return word
    pieces, piece = [], ""
    for part in word.split("/")[:-1]:
        if piece and len(piece) + len(part) + 1 > width:
            pieces.append(piece)
            piece = ""
        piece += part + "/"
    last = word.rsplit("/", 1)[1]
    if piece and len(piece) + len(last) > width:
        pieces.append(piece)
        piece = ""
    pieces.append(piece + last)
    return " ".join(p for p in pieces if p)


def echo(text: str) -> None:
    """A line of a command's human output on stdout, wrapped at word boundaries to the terminal."""
    for line in wrap_text(text, console().width):
        sys.stdout.write(line + "\n")


def note(message: str, wrap: bool = False) -> None:
    """A line for the human on stderr, so that stdout stays parseable (-q silences it).

    `wrap`: break a long line (a warning) at word boundaries to the terminal's width, rather than
    let the terminal cut words at its edge; piped without COLUMNS it stays one line, for grep."""
    if VERBOSITY < 0:
        return
    width = 0
    if wrap:
        err = console(stderr=True)
        width = err.width if err.is_terminal or os.environ.get("COLUMNS") else 0
    for line in wrap_text(message, width):
        sys.stderr.write(line + "\n")


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
