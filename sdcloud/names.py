"""Names a user types (tiers, providers, trainers): matched case-insensitively, with a "did you mean"."""

from __future__ import annotations

import difflib
import re
from typing import Iterable

from .errors import UserError


def match_name(given: str, valid: Iterable[str], what: str) -> str:
    """The valid name `given` means, whatever its case; else one line that suggests the nearest."""
    names = list(valid)
    by_lower = {n.lower(): n for n in names}
    key = str(given).strip().lower()
    if key in by_lower:
        return by_lower[key]
    near = difflib.get_close_matches(key, list(by_lower), n=1, cutoff=0.6)
    hint = f"; did you mean {by_lower[near[0]]}?" if near else ""
    raise UserError(f"unknown {what} {given!r}{hint} (valid {what}s: {', '.join(names)})")


# A run's or batch job's name: what `status` shows, what `down NAME` finds, a folder name on a host.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
# Ids sdcloud gives (runs/driving/controller.py new_run_id, batch/submit.py new_job_id): a name shaped
# like one would be taken for that id by every command that takes "an id or a name".
_ID = re.compile(r"[rb]-[0-9a-f]{8}", re.IGNORECASE)


def check_name(value: object, flag: str = "--name") -> str:
    """A run's or batch job's name, checked the same way for both; one line otherwise."""
    name = str(value)
    if not _NAME.fullmatch(name):
        raise UserError(f"{flag} must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit, "
                        f"got {printable(name)}")
    if _ID.fullmatch(name):
        raise UserError(f"{flag} {name!r} looks like a run or job id (r-/b- and 8 hex digits): choose another name")
    return name


# C0 and C1 control characters, DEL included: a terminal acts on them (ESC [2J clears the screen).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str, limit: int = 80) -> str:
    """User input as an error may quote it: control characters written as escapes, long text cut."""
    return repr(text if len(text) <= limit else text[:limit] + "…")  # repr writes ESC as \x1b, a newline as \n


def strip_controls(text: str) -> str:
    """Text as sdcloud prints it from user input: terminal escapes and other control characters removed
    (tabs and newlines turned into spaces), so nothing a user typed can act on the terminal."""
    text = re.sub(r"\x1b\[[0-9;?]*[ -/]*[@-~]", "", text)  # a whole CSI sequence (colours, clear screen)
    return _CONTROL.sub(lambda m: " " if m.group() in "\t\n\r" else "", text)


def has_controls(text: str) -> bool:
    return bool(_CONTROL.search(text))
