"""The control plane's calendar clock: one place that reads it, so that tests can set it.

Ages and dates that a user sees (how old a price is, which day a cost falls on) come from
`utc_now()`; a test freezes it with the `clock` fixture (tests/conftest.py) instead of depending on
the hour it happens to run at.
"""

from __future__ import annotations

from datetime import datetime, timezone


def utc_now() -> datetime:
    """Now, as an aware UTC datetime."""
    return datetime.now(timezone.utc)
