"""Minutes lost per cause in the cost report (sdcloud/costs/losses.py): data wait, throttling and
saves from the host's health events, out-of-memory restarts from their retries and the progress
after them, reclaims from the ledger, boots from launch to first step; each priced at its attempt's
rate, the same in JSON, CSV, the table and the HTML. Every figure is worked out here by hand."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import datetime, timezone

import pytest

from sdcloud.cli import main
from sdcloud.costs import ledger
from sdcloud.events import Kind
from sdcloud.offers.catalog import CatalogRow
from sdcloud.offers.optimizer import Offer
from sdcloud.runs.records.state import StateStore
from sdcloud_agent.store import open_store

T0 = datetime(2026, 11, 9, 0, 0, tzinfo=timezone.utc).timestamp()
OD = 1.006


def _row() -> CatalogRow:
    return CatalogRow(provider="aws", region="us-east-1", zone="us-east-1a", instance_type="g5.xlarge", gpu="A10G",
                      gpu_count=1, vram_gb=24, vcpus=4, memory_gb=16, nvme_gb=250, ondemand_price=OD, spot_price=0.40,
                      currency="USD", interruption_band=2, snapshot_date="2026-11-01", ondemand_estimate=False,
                      spot_estimate=False, source="test")


def _event(state, run_id, at, kind, data):
    state.event(run_id, kind, data)
    state._db.execute("UPDATE events SET time = ? WHERE id = (SELECT MAX(id) FROM events)", (at,))


@pytest.fixture
def troubled_run(sdcloud_home, tmp_path):
    state = StateStore()
    run_id = "r-trouble1"
    state.create_run(run_id, "sd15-lora", {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1"}, 1000, "t")
    state.update_run(run_id, step=1000, state="succeeded")
    store = open_store((tmp_path / "bucket").as_uri())
    state.add_attempt(run_id, 1, "aws", "tok1", region="us-east-1", zone="us-east-1a", instance_type="g5.xlarge",
                      market="on-demand", price=OD, currency="USD")
    state.update_attempt(run_id, 1, state="running", start=T0, instance_id="i-1")
    ledger.started(state, run_id, 1, Offer(_row(), "on-demand"), "on-demand", 100, zone="us-east-1a", at=T0)
    att = state.attempts(run_id)[0]
    # Boot: 240 s from launch to the first step.
    ledger.observe(state, run_id, att, {"attempt": 1, "phase": "training", "step": 1, "time": T0 + 240, "it_per_s": 1.0},
                   now=T0 + 240)
    # Health: io-bound for two minutes (data wait 40%), then throttled for two (clock at 80%, saves 10%).
    _event(state, run_id, T0 + 300, Kind.HEALTH, {"attempt": 1, "verdict": "io-bound", "data_wait_pct": 40.0})
    _event(state, run_id, T0 + 360, Kind.HEALTH, {"attempt": 1, "verdict": "io-bound", "data_wait_pct": 40.0})
    _event(state, run_id, T0 + 420, Kind.HEALTH, {"attempt": 1, "verdict": "throttled", "throttle_pct": 60.0,
                                                   "sm_clock_pct": 80.0, "save_pct": 10.0})
    _event(state, run_id, T0 + 480, Kind.HEALTH, {"attempt": 1, "verdict": "throttled", "throttle_pct": 60.0,
                                                   "sm_clock_pct": 80.0, "save_pct": 10.0})
    # An out-of-memory at step 500 (retry seen at +600); back at step 500 at +690.
    _event(state, run_id, T0 + 590, Kind.PROGRESS, {"attempt": 1, "step": 500, "total": 1000})
    _event(state, run_id, T0 + 600, Kind.OOM_RETRY, {"attempt": 1, "n": 1, "rung": "gradient-checkpointing",
                                                     "resume_step": 450})
    _event(state, run_id, T0 + 650, Kind.PROGRESS, {"attempt": 1, "step": 470, "total": 1000})
    _event(state, run_id, T0 + 690, Kind.PROGRESS, {"attempt": 1, "step": 505, "total": 1000})
    # A second one, whose cost the host measured (its trainer's start-up and the steps redone): 30 s.
    _event(state, run_id, T0 + 900, Kind.OOM_RETRY, {"attempt": 1, "n": 2, "rung": "half-batch", "resume_step": 500,
                                                     "lost_s": 30.0})
    # The last health event is healthy: nothing more is charged after it.
    _event(state, run_id, T0 + 540, Kind.HEALTH, {"attempt": 1, "verdict": "healthy", "data_wait_pct": 0.0})
    state.update_attempt(run_id, 1, state="ended", end=T0 + 3600, end_reason="succeeded")
    ledger.closed(state, run_id, 1, None, store)
    return state, run_id


# By hand: data wait 2 x 60 s x 40% = 48 s; throttling 2 x 60 s x (1 - 0.8) = 24 s; saves 2 x 60 s x
# 10% = 12 s; OOM restarts +600 -> +690 = 90 s and 30 s measured; boot 240 s; no reclaim.
BY_HAND_MIN = {"data_wait": 0.8, "throttling": 0.4, "saves": 0.2, "oom_restarts": 2.0, "reclaims": 0.0, "boots": 4.0,
               "sampling": 0.0}


def _out(capsys, *args) -> str:
    capsys.readouterr()
    assert main(list(args)) == 0
    return capsys.readouterr().out


def test_minutes_lost_per_cause_with_their_cost_in_every_format(troubled_run, capsys, tmp_path):
    state, run_id = troubled_run
    rep = json.loads(_out(capsys, "cost", "report", run_id, "--format", "json"))
    (run,) = rep["runs"]
    loss = run["losses"]
    assert loss["minutes"] == pytest.approx(BY_HAND_MIN, abs=0.01)
    (a,) = run["attempts"]
    rate = a["cost_usd"] / a["hours"]
    for cause, minutes in BY_HAND_MIN.items():
        assert loss["usd"][cause] == pytest.approx(minutes / 60 * rate, abs=1e-4), cause
    assert loss["total_minutes"] == pytest.approx(sum(BY_HAND_MIN.values()), abs=0.01)
    assert rep["totals"]["losses"]["minutes"] == loss["minutes"]
    rows = list(csv.DictReader(io.StringIO(_out(capsys, "cost", "report", run_id, "--format", "csv"))))
    lost = {r["cause"]: (float(r["lost_minutes"]), float(r["lost_usd"])) for r in rows if r["level"] == "loss"}
    assert set(lost) == {c for c, m in BY_HAND_MIN.items() if m}  # a cause that lost nothing has no row
    for cause, (minutes, usd) in lost.items():
        assert minutes == loss["minutes"][cause] and usd == loss["usd"][cause]
    table = " ".join(_out(capsys, "cost", "report", run_id).split())
    assert (f"minutes lost: data wait 0.80 (${loss['usd']['data_wait']:.4f}), throttling 0.40 "
            f"(${loss['usd']['throttling']:.4f}), saves 0.20") in table
    assert "OOM restarts 2.00" in table and "boots 4.00" in table and "reclaims" not in table.split("minutes lost")[1].split("in all")[0]
    page = tmp_path / "r.html"
    assert main(["cost", "report", run_id, "--format", "html", "--output", str(page)]) == 0
    text = page.read_text()
    assert "Minutes lost, per cause" in text
    assert re.search(rf'data-loss="oom_restarts-usd">{loss["usd"]["oom_restarts"]:.4f}<', text)


def test_the_hosts_own_totals_of_saves_and_data_wait_are_charged_as_measured(sdcloud_home, capsys, tmp_path):
    """A host that totals its seconds in saves and data wait (each health event carries the total so
    far) is charged those seconds, whatever the verdicts and however close together its events came;
    the shares then count for nothing, and each attempt's newest total is its own."""
    state = StateStore()
    run_id = "r-totals01"
    state.create_run(run_id, "sd15-lora", {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1"}, 100, "t")
    store = open_store((tmp_path / "bucket").as_uri())
    for n, start in ((1, T0), (2, T0 + 1800)):
        state.add_attempt(run_id, n, "aws", f"tok{n}", region="us-east-1", zone="us-east-1a",
                          instance_type="g5.xlarge", market="on-demand", price=OD, currency="USD")
        state.update_attempt(run_id, n, state="running", start=start, instance_id=f"i-{n}")
        ledger.started(state, run_id, n, Offer(_row(), "on-demand"), "on-demand", 100, zone="us-east-1a", at=start)
    # Attempt 1: save-bound for 0.2 s only, then the trainer exited; the host's totals: 9 s of saves,
    # 30 s of data wait. The shares (50%, 40%) over those 0.2 s would give almost nothing.
    _event(state, run_id, T0 + 100, Kind.HEALTH, {"attempt": 1, "verdict": "save-bound", "save_pct": 50.0,
                                                   "data_wait_pct": 40.0, "save_seconds": 3.0,
                                                   "data_wait_seconds": 12.0})
    _event(state, run_id, T0 + 100.2, Kind.HEALTH, {"attempt": 1, "verdict": "healthy", "save_pct": 50.0,
                                                     "save_seconds": 9.0, "data_wait_seconds": 30.0})
    _event(state, run_id, T0 + 100.3, Kind.HEALTH, {"attempt": 1, "trainer_exit": 0, "last_verdict": "healthy",
                                                     "save_seconds": 9.0, "data_wait_seconds": 30.0})
    # Attempt 2: a trainer that did not say its data wait (null, so absent); 6 s of saves.
    _event(state, run_id, T0 + 1900, Kind.HEALTH, {"attempt": 2, "verdict": "healthy", "save_seconds": 6.0})
    for n, end in ((1, T0 + 1800), (2, T0 + 3600)):
        state.update_attempt(run_id, n, state="ended", end=end, end_reason="succeeded")
        ledger.closed(state, run_id, n, None, store)
    rep = json.loads(_out(capsys, "cost", "report", run_id, "--format", "json"))
    loss = rep["runs"][0]["losses"]
    assert loss["minutes"]["saves"] == pytest.approx((9.0 + 6.0) / 60, abs=0.005)
    assert loss["minutes"]["data_wait"] == pytest.approx(30.0 / 60, abs=0.005)
    rates = {a["n"]: a["cost_usd"] / a["hours"] for a in rep["runs"][0]["attempts"]}
    assert loss["usd"]["saves"] == pytest.approx(9.0 / 3600 * rates[1] + 6.0 / 3600 * rates[2], abs=1e-4)


def test_a_run_that_lost_nothing_prints_no_losses_line(sdcloud_home, capsys, tmp_path):
    state = StateStore()
    state.create_run("r-calm0001", "sd15-lora", {"tier": "sd15-lora", "provider": "aws"}, 10, "c")
    rep = json.loads(_out(capsys, "cost", "report", "r-calm0001", "--format", "json"))
    assert rep["runs"][0]["losses"]["total_minutes"] == 0
    assert "minutes lost" not in _out(capsys, "cost", "report", "r-calm0001")
