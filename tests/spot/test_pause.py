"""The pause policy (sdcloud/spot/pause.py): wait for a paused host, raise its bid, or relaunch, from the
deadline, the slack and the measured pauses; and its replay on traces read as pause periods."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sdcloud.spot.pause import (MAX_WAIT_HOURS, PRIOR_PAUSE_HOURS, PauseChoice, PauseFacts, compare, decide,
                                expected_pause_hours, patience_hours, pauses_of, replay)
from sdcloud.spot.traces import Trace


def facts(**kw) -> PauseFacts:
    base = dict(paused_hours=0.0, work_left_hours=5.0, hours_to_deadline=None, bid=0.23, min_bid=0.25, max_price=None,
                relaunch_price=0.40)
    return PauseFacts(**{**base, **kw})


def test_without_a_deadline_a_fresh_pause_is_waited_for():
    d = decide(facts())
    assert d.choice == PauseChoice.WAIT and "no deadline" in d.why


def test_a_pause_past_its_patience_is_not_waited_for_forever():
    d = decide(facts(paused_hours=patience_hours(()) + 0.01))
    assert d.choice != PauseChoice.WAIT and "patience" in d.why


def test_little_slack_raises_the_bid_when_that_is_cheaper_than_a_relaunch():
    d = decide(facts(hours_to_deadline=5.5))  # slack 0.3 h < the expected hour
    assert d.choice == PauseChoice.RAISE_BID and d.new_bid == pytest.approx(0.25 * 1.15)


def test_a_winning_bid_over_max_price_relaunches():
    d = decide(facts(hours_to_deadline=5.5, max_price=0.26))
    assert d.choice == PauseChoice.RELAUNCH and "max-price" in d.why


def test_a_raise_dearer_than_a_relaunch_relaunches():
    # Outbid far above us on a long job: the extra $/h over the work left costs more than moving.
    d = decide(facts(hours_to_deadline=50.5, work_left_hours=50.0, min_bid=1.0, relaunch_price=0.30))
    assert d.choice == PauseChoice.RELAUNCH and "costs more than a relaunch" in d.why


def test_an_unknown_minimum_bid_cannot_be_raised():
    assert decide(facts(hours_to_deadline=5.5, min_bid=None)).choice == PauseChoice.RELAUNCH


def test_enough_slack_waits_even_with_a_deadline():
    assert decide(facts(hours_to_deadline=20.0)).choice == PauseChoice.WAIT


def test_the_measured_pauses_replace_the_prior():
    assert expected_pause_hours(()) == PRIOR_PAUSE_HOURS
    assert expected_pause_hours((0.1, 0.3)) == pytest.approx(0.2)
    # Short pauses measured: 0.5 h of slack is enough to wait; with the prior's hour it is not.
    assert decide(facts(hours_to_deadline=5.7, history_hours=(0.1, 0.3))).choice == PauseChoice.WAIT
    assert decide(facts(hours_to_deadline=5.7)).choice != PauseChoice.WAIT


def test_patience_is_bounded():
    assert patience_hours((100.0,)) == MAX_WAIT_HOURS
    assert patience_hours((0.5,)) == pytest.approx(1.0)


def test_a_trace_reads_as_pauses_in_hours_of_work_done():
    avail = [True, True, False, False, False, True, False, True]  # 1 h ticks
    assert pauses_of(avail, 3600, 0, 4) == [(2.0, 3.0), (3.0, 1.0)]
    assert pauses_of(avail, 3600, 2, 1) == [(0.0, 3.0)]
    assert pauses_of([False] * 4, 3600, 0, 1) == [(0.0, 8.0)]  # never available: bounded at two laps


def test_always_wait_pays_the_disk_and_the_hours():
    r = replay([(1.0, 10.0)], work_hours=2.0, bid=0.2, relaunch_price=0.5, deadline_hours=None, choose="wait",
               disk_usd_per_hour=0.01)
    assert r.hours == pytest.approx(12.0) and r.cost == pytest.approx(2 * 0.2 + 10 * 0.01)


def test_always_relaunch_moves_at_the_first_pause():
    r = replay([(1.0, 10.0), (1.5, 1.0)], work_hours=2.0, bid=0.2, relaunch_price=0.5, deadline_hours=3.0,
               choose="relaunch", restart_hours=0.2, checkpoint_hours=0.2)
    assert r.hours == pytest.approx(1.0 + 1.0 + 0.2 + 0.1) and r.met_deadline
    assert r.cost == pytest.approx(0.2 + 1.3 * 0.5)


def test_the_policy_waits_out_a_short_pause_and_gives_up_a_long_one():
    short = replay([(1.0, 0.5)], 2.0, 0.2, 0.5, None)
    assert short.hours == pytest.approx(2.5)
    long = replay([(1.0, 50.0)], 2.0, 0.2, 0.5, None)
    assert long.hours < 10 and long.cost < replay([(1.0, 50.0)], 2.0, 0.2, 0.5, None, choose="wait").cost + 1


def test_a_replay_can_miss_its_deadline():
    assert not replay([(1.0, 10.0)], 2.0, 0.2, 0.5, 5.0, choose="wait").met_deadline


def test_on_a_trace_the_policy_is_faster_than_waiting_and_cheaper_than_relaunching():
    rng = np.random.default_rng(3)
    avail = np.repeat(rng.random(400) < 0.7, 3)  # runs of 3 ticks, 30 % of them unavailable
    trace = Trace("zone-a", 600, avail)
    rows = {r["choice"]: r for r in compare([trace], 10.0, 30.0, 0.23, 0.40, starts=60, seed=1)}
    assert rows["sdcloud"]["mean_hours"] <= rows["always-wait"]["mean_hours"]
    assert rows["sdcloud"]["mean_usd"] <= rows["always-relaunch"]["mean_usd"]
    assert rows["sdcloud"]["deadline_met_pct"] >= rows["always-wait"]["deadline_met_pct"]


def test_simulate_pauses_prints_the_three_choices(tmp_path, capsys):
    from sdcloud.cli import main

    path = tmp_path / "zone.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": ([1] * 12 + [0] * 6) * 40}))
    code = main(["simulate", "--pauses", "--trace", str(path), "--job-hours", "5", "--deadline-hours", "12",
                 "--restart-hours", "0.2", "--spot-price", "0.23", "--ondemand-price", "0.4", "--starts", "20", "--json"])
    assert code in (0, None)
    rows = json.loads(capsys.readouterr().out)
    assert [r["choice"] for r in rows] == ["sdcloud", "always-wait", "always-relaunch"]
    assert all(r["runs"] == 20 for r in rows)
