from datetime import datetime, timedelta, timezone

import pytest

from sdcloud.costs.pricing import time_weighted_price

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def h(x: float) -> datetime:
    return T0 + timedelta(hours=x)


def test_price_in_force_before_the_start_counts():
    # 0.30 from before the start, 0.60 from 1 h in: over 2 h the mean is 0.45.
    assert time_weighted_price([(h(-5), 0.30), (h(1), 0.60)], h(0), h(2)) == pytest.approx(0.45)


def test_changes_after_the_end_are_ignored_and_unknown_is_none():
    assert time_weighted_price([(h(-1), 0.2), (h(3), 9.0)], h(0), h(2)) == pytest.approx(0.2)
    assert time_weighted_price([], h(0), h(1)) is None
    assert time_weighted_price([(h(0), 1.0)], h(1), h(1)) is None


def test_several_changes():
    pts = [(h(0), 1.0), (h(0.5), 2.0), (h(1.5), 0.5)]
    # 0.5 h at 1.0 + 1 h at 2.0 + 0.5 h at 0.5 over 2 h
    assert time_weighted_price(pts, h(0), h(2)) == pytest.approx((0.5 + 2.0 + 0.25) / 2)
