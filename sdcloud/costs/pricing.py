"""Cost accounting: what an attempt really cost, priced from the spot price history of its own
zone and hours (not today's catalog), when the provider keeps one."""

from __future__ import annotations

from datetime import datetime, timezone


def time_weighted_price(points: list[tuple[datetime, float]], start: datetime, end: datetime) -> float | None:
    """The mean price over [start, end] of a step function that changes at `points` (oldest first).

    A point before `start` sets the price in force at the start; None when nothing is known.
    """
    if end <= start or not points:
        return None
    points = sorted(points)
    in_force = [p for t, p in points if t <= start]
    price = in_force[-1] if in_force else points[0][1]
    total = 0.0
    cursor = start
    for t, p in points:
        if t <= start:
            continue
        if t >= end:
            break
        total += price * (t - cursor).total_seconds()
        cursor, price = t, p
    total += price * (end - cursor).total_seconds()
    return total / (end - start).total_seconds()


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, timezone.utc)
