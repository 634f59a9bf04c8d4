"""Dates that sdcloud writes are UTC days from its one clock (sdcloud.clock), so that a price's age
never depends on the hour or the machine's time zone (issue 23: a test failed from 22:48 UTC on).

Run near midnight to check: TZ=UTC faketime -f "@2026-12-02 23:59:00" python -m pytest -q tests/test_clock.py
"""

from __future__ import annotations

import time

import pytest


@pytest.fixture
def east_of_utc(monkeypatch):
    """The machine's zone 8 hours east of UTC: at 23:30 UTC its local date is already tomorrow."""
    monkeypatch.setenv("TZ", "Asia/Shanghai")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_the_local_offer_is_dated_by_the_utc_day_of_sdcloud_clock(clock, east_of_utc):
    from sdcloud.providers.local.provider import LocalProvider

    clock.set("2026-12-01T23:30:00+00:00")
    (offer,) = LocalProvider().offers()
    assert offer.row.snapshot_date == "2026-12-01"
    assert offer.row.price_age_days("on-demand") == 1.0  # 23.5 h after the start of its day


def test_an_aws_refresh_dates_its_prices_by_the_utc_day(clock, east_of_utc, aws_env, capsys):
    from moto import mock_aws

    from sdcloud.cli import main
    from sdcloud.offers.catalog import load_provider

    clock.set("2026-12-01T23:30:00+00:00")
    with mock_aws():
        assert main(["catalog", "refresh", "--provider", "aws", "--region", "us-east-1", "--json"]) == 0
    capsys.readouterr()
    rows, source = load_provider("aws")
    refreshed = {r.snapshot_date for r in rows if r.region == "us-east-1" and r.source.startswith("refreshed")}
    assert refreshed == {"2026-12-01"}
    assert source.as_of is not None and source.as_of.isoformat() == "2026-12-01T23:30:00+00:00"
