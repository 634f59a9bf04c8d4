"""Durations as users write them ('36h', '1d12h', '90m', '10m', '90s'): one parser for run flags,
batch flags and config.toml settings. At the bottom of the house, so that config may use it too."""

from __future__ import annotations

import re

from .errors import UserError

_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*d)?\s*(?:(\d+(?:\.\d+)?)\s*h)?"
                       r"\s*(?:(\d+(?:\.\d+)?)\s*m)?\s*(?:(\d+(?:\.\d+)?)\s*s)?\s*$")


def parse_duration(text: str | float | int, what: str = "--deadline") -> float:
    """Hours from '36h', '1d12h', '90m', '2.5h' or a bare number of hours."""
    if isinstance(text, (int, float)):
        hours = float(text)
    else:
        raw = str(text).strip().lower()
        try:
            hours = float(raw)
        except ValueError:
            m = _DURATION.match(raw)
            if not raw or not m or not any(m.groups()):
                raise UserError(f"{what} must be a duration such as 36h, 1d12h or 90m, got {text!r}") from None
            d, h, mi, s = (float(g) if g else 0.0 for g in m.groups())
            hours = d * 24 + h + mi / 60 + s / 3600
    if not hours > 0:
        raise UserError(f"{what} must be longer than zero, got {text!r}")
    return hours


def parse_seconds(text: str | float | int, what: str) -> float:
    """Seconds from '10m', '90s', '1h' or a bare number of seconds; 0 is allowed (no wait)."""
    raw = str(text).strip().lower()
    try:
        value = float(raw)
    except ValueError:
        if raw in ("0", "0s", "0m", "0h"):
            return 0.0
        value = parse_duration(raw, what) * 3600
    if value < 0 or value != value:
        raise UserError(f"{what} must be 0 or more seconds (or a duration such as 10m), got {text!r}")
    return value
