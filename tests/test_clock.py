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


INNER = '''
import os, subprocess, sys, time
from datetime import datetime, timezone
from pathlib import Path


def test_inner():
    # This worker was started without the library: LD_PRELOAD is not in the environment it began with.
    assert b"LD_PRELOAD=" not in Path("/proc/self/environ").read_bytes()
    child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('LD_PRELOAD'))"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.split() == ["libm.so.6"]
    # Its own Python clock moved by the offset, as the library moves its children's.
    assert abs(time.time() - datetime.now(timezone.utc).timestamp() - 7200) < 60
    from sdcloud import clock
    assert abs((clock.utc_now() - datetime.now(timezone.utc)).total_seconds() - 7200) < 60
'''


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "1"])
def test_at_another_hour_the_library_reaches_only_the_processes_the_tests_start(tmp_path, workers):
    """.ci/at-hour's mode: libfaketime (here a harmless stand-in, libm) is preloaded into what a test
    starts, never into pytest's own process or its workers (one crashed there at 23:59)."""
    import os
    import subprocess
    import sys

    from tests.support import ROOT

    (tmp_path / "test_inner.py").write_text(INNER)
    env = {**os.environ, "SDCLOUD_FAKETIME_LIB": "libm.so.6", "FAKETIME": "+7200s"}
    env.pop("LD_PRELOAD", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                          "-n", workers, "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
                         cwd=tmp_path, env={**env, "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "1 passed" in run.stdout
