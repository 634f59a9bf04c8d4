"""The control plane's calendar clock: one place that reads it, so that tests can set it.

Ages and dates that a user sees (how old a price is, which day a cost falls on) come from
`utc_now()`; a test freezes it with the `clock` fixture (tests/conftest.py) instead of depending on
the hour it happens to run at.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone


def utc_now() -> datetime:
    """Now, as an aware UTC datetime."""
    return datetime.now(timezone.utc)


def epoch() -> float:
    """Now, in seconds since the epoch, for what a running thing has cost so far (costs/ledger.py,
    costs/report.py): `batch status` and `cost report` read it alike, and a test pins it to compare them."""
    return time.time()
