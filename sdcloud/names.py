"""Names a user types (tiers, providers, trainers): matched case-insensitively, with a "did you mean"."""

from __future__ import annotations

import difflib
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
