"""The spot policy and the simulator across two clouds: a move is a restart that also copies the
checkpoint (hours) and pays the source cloud's egress (USD); docs/policies.md, "Across clouds"."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sdcloud.cli import main
from sdcloud.spot.policy import ON_DEMAND, SPOT, WAIT, Observation, ZoneView, get_policy
from sdcloud.spot.simulate import Setting, replay, simulate

TICK = 600
G = TICK / 3600


def two_clouds(home_up: bool, far_up: bool, *, t: float, p: float = 0.0, market=None, zone=None,
               move_usd: float = 0.5, far_spot: float = 1.0, far_od: float = 3.0) -> Observation:
    zones = [ZoneView("home-a", home_up, 1.0, 3.0, "home"), ZoneView("far-a", far_up, far_spot, far_od, "far")]
    return Observation(t, p, 10.0, 20.0, 0.2, zone, market, zones, G, data_cloud="home", move_hours=0.1,
                       move_usd=move_usd)


def test_spot_in_the_checkpoints_cloud_comes_first():
    # Both clouds have spot, the far one a little cheaper: the job stays where its checkpoint is (no move):
    # 10 h + 0.2 h at 1 $ = 10.2 $ here; there 10.3 h at 0.9 $ + 0.5 $ = 9.77 $, not 10% less.
    act = get_policy("sdcloud").decide(two_clouds(True, True, t=0.0, far_spot=0.9))
    assert (act.kind, act.zone) == (SPOT, "home-a")


def test_a_far_spot_much_cheaper_to_finish_on_is_a_move_at_a_launch_but_never_of_a_running_host():
    # Far spot at 0.5 $: 10.3 h x 0.5 $ + 0.5 $ egress = 5.65 $ against 10.2 $ here, more than 10% less:
    # after a reclaim (the job ran in home-a) it moves; its first launch stays in the home cloud.
    act = get_policy("sdcloud").decide(two_clouds(True, True, t=0.0, far_spot=0.5, zone="home-a"))
    assert (act.kind, act.zone) == (SPOT, "far-a")
    assert get_policy("sdcloud").decide(two_clouds(True, True, t=0.0, far_spot=0.5)).zone == "home-a"
    # A host running spot at home stays there (a running host never changes cloud).
    act = get_policy("sdcloud").decide(two_clouds(True, True, t=1.0, p=1.0, far_spot=0.5, market=SPOT, zone="home-a"))
    assert (act.kind, act.zone) == (SPOT, "home-a")
    # The egress eats the saving: 5.15 $ + 5 $ is not 10% under 10.2 $.
    act = get_policy("sdcloud").decide(two_clouds(True, True, t=0.0, far_spot=0.5, move_usd=5.0, zone="home-a"))
    assert (act.kind, act.zone) == (SPOT, "home-a")


def test_the_price_rule_is_off_with_no_margin_and_needs_the_slack_for_its_restart():
    from sdcloud.spot.policy import Sdcloud

    sd = Sdcloud()
    sd.MOVE_MARGIN = None
    assert sd.decide(two_clouds(True, True, t=0.0, far_spot=0.5, zone="home-a")).zone == "home-a"
    # Slack 0.45 h: a restart and copy (0.3 h) would leave it under the net (0.4 h): no move for price.
    act = get_policy("sdcloud").decide(two_clouds(True, True, t=9.55, far_spot=0.5, zone="home-a"))
    assert act.zone != "far-a"


def test_spot_refused_in_the_checkpoints_cloud_moves_to_the_other_clouds_spot_deadline_or_none():
    from sdcloud.spot.policy import SPOT_REFUSALS

    refused = two_clouds(True, True, t=0.0)
    refused.spot_refusals = SPOT_REFUSALS
    act = get_policy("sdcloud").decide(refused)
    assert (act.kind, act.zone) == (SPOT, "far-a")  # not on-demand here: the other cloud's spot
    refused.has_deadline = False
    assert get_policy("sdcloud").decide(refused).zone == "far-a"
    refused.spot_refusals = SPOT_REFUSALS - 1  # not yet: home's spot is tried again
    assert get_policy("sdcloud").decide(refused).zone == "home-a"
    # With a deadline and no far spot, spot gone means on-demand at home, as in one cloud.
    gone = two_clouds(True, False, t=0.0)
    gone.spot_refusals = SPOT_REFUSALS
    assert get_policy("sdcloud").decide(gone).kind == ON_DEMAND
    # One cloud (data_cloud unset): nothing moves; spot gone with a deadline is on-demand.
    gone.data_cloud = None
    assert get_policy("sdcloud").decide(gone).kind == ON_DEMAND


def test_replay_logs_each_launch_tried_with_its_move_and_refusal():
    from sdcloud.spot.policy import SPOT_REFUSALS

    n = SPOT_REFUSALS + 4
    setting = Setting(1.0, 40.0, 0.2, 1.0, 3.0, move_hours=0.1, move_usd=0.5)
    avail = np.ones((2, 400), bool)
    refused = np.zeros((2, 400), bool)
    refused[0, :n] = True  # home refuses every spot launch for a while; far takes them
    log: list = []
    out = replay(get_policy("sdcloud"), avail, ["home:a", "far:a"], TICK, 0, 0, setting, refused=refused,
                 clouds=["home", "far"], log=log)
    assert [e[4] for e in log[:SPOT_REFUSALS]] == [True] * SPOT_REFUSALS and {e[2] for e in log[:SPOT_REFUSALS]} == {"home:a"}
    # After SPOT_REFUSALS refusals at home: the far cloud's spot, a move, at the next tick.
    assert log[SPOT_REFUSALS] == (SPOT_REFUSALS, SPOT, "far:a", True, False)
    assert out.moves == 1 and out.cost == pytest.approx(0.5 + 1.3)


def test_another_clouds_spot_instead_of_on_demand_when_the_move_repays_itself():
    sd = get_policy("sdcloud")
    # C = 10 h, R = 20 h. Slack ample (10 h, reserve 2.5 h): wait for the home cloud's spot, as the
    # one-cloud policy does.
    assert sd.decide(two_clouds(False, True, t=0.0)).kind == WAIT
    # Slack 0.5 h: on-demand is due. The far spot repays the move (4 h x (3 - 1) $ > 0.5 $ + 0.3 h
    # x 1 $), but the slack after it, 0.5 - 0.2 - 0.1 = 0.2 h, is below the net of 0.4 h: on-demand at home.
    assert sd.decide(two_clouds(False, True, t=9.5)).kind == ON_DEMAND
    # Slack 1.5 h: the move leaves 1.2 h, and it goes through.
    act = get_policy("sdcloud").decide(two_clouds(False, True, t=8.5))
    assert (act.kind, act.zone) == (SPOT, "far-a")
    # An egress dearer than what the far spot saves: on-demand in the checkpoint's cloud instead.
    act = get_policy("sdcloud").decide(two_clouds(False, True, t=8.5, move_usd=50.0))
    assert (act.kind, act.zone) == (ON_DEMAND, "home-a")


def test_the_on_demand_fallback_stays_in_the_checkpoints_cloud():
    # The far cloud's on-demand is cheaper, but a launch there pays a move: the safety net's launch
    # must cost d only, so the fallback is the home cloud's on-demand.
    obs = two_clouds(False, False, t=9.9, far_od=1.5)
    act = get_policy("sdcloud").decide(obs)
    assert (act.kind, act.zone) == (ON_DEMAND, "home-a")


def test_one_cloud_reference_never_moves():
    setting = Setting(1.0, 3.0, 0.2, 1.0, 3.0, move_hours=0.1, move_usd=0.5)
    avail = np.array([[False] * 30, [True] * 30])  # home: no spot ever; far: spot all along
    keys, clouds = ["home:a", "far:a"], ["home", "far"]
    moved = replay(get_policy("sdcloud"), avail, keys, TICK, 0, 0, setting, clouds=clouds)
    stayed = replay(get_policy("sdcloud-one-cloud"), avail, keys, TICK, 0, 0, setting, clouds=clouds)
    # By hand: one move, 0.2 h restart + 0.1 h copy + 1 h of work on far spot at 1 $/h, plus 0.5 $ egress.
    assert moved.moves == 1 and moved.cost == pytest.approx(0.5 + 1.3)
    assert moved.finish_hours <= 3.0
    # The reference waits while its slack allows, then on-demand at home: 1.2 h at 3 $/h.
    assert stayed.moves == 0 and stayed.cost == pytest.approx(3.6) and stayed.finish_hours <= 3.0


def test_a_move_is_paid_again_after_a_return_and_the_data_follows_the_host():
    setting = Setting(2.0, 6.0, 0.2, 1.0, 3.0, move_hours=0.1, move_usd=0.5)
    # Home spot for 1 h, then gone for good; far spot all along.
    home = np.array([True] * 6 + [False] * 40)
    avail = np.stack([home, np.ones(46, bool)])
    out = replay(get_policy("sdcloud"), avail, ["h", "f"], TICK, 0, 0, setting, clouds=["home", "far"])
    assert out.finish_hours <= 6.0 and out.moves == 1


@pytest.mark.parametrize("move_hours", [0.05, 0.5, 2.0])
def test_every_deadline_met_across_clouds_on_random_traces(move_hours):
    from tests.spot.test_policy import markov

    rng = np.random.default_rng(7)
    for p_fail, p_back in [(0.05, 0.05), (0.3, 0.3), (0.5, 0.05)]:
        avail = markov(rng, 3, int(150 / G), p_fail, p_back)
        for ratio in (0.6, 0.9):
            st = Setting(12.0, max(12.0 / ratio, 12.0 + 0.2 + 2 * G), 0.2, 1.0, 3.0, move_hours=move_hours, move_usd=2.0)
            for res in simulate(avail, ["a", "b", "c"], TICK, st, ["sdcloud", "sdcloud-one-cloud"], starts=15, seed=1,
                                clouds=["x", "x", "y"]):
                assert res.met.all(), (res.policy, p_fail, p_back, ratio, move_hours)


def _trace(path, data):
    path.write_text(json.dumps({"metadata": {"gap_seconds": TICK}, "data": data}))
    return str(path)


def test_simulate_two_clouds_from_the_command_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    # Home spot comes and goes in 8-hour outages; the other cloud's spot is up while home's is down.
    home = ([1] * 48 + [0] * 48) * 6
    far = ([0] * 48 + [1] * 48) * 6
    args = ["simulate", "--trace", "aws:" + _trace(tmp_path / "home.json", home),
            "--trace", "tencent:" + _trace(tmp_path / "far.json", far),
            "--cloud-prices", "tencent:7.1:21.3:CNY", "--spot-price", "1", "--ondemand-price", "3",
            "--job-hours", "12", "--deadline-hours", "15", "--restart-hours", "0.2",
            "--move-hours", "0.1", "--move-usd", "0.5", "--starts", "20", "--json"]
    assert main(args) == 0
    captured = capsys.readouterr()
    res = {r["policy"]: r for r in json.loads(captured.out)}
    assert "optimal" not in res  # the optimum knows no moves: left out by default
    assert res["sdcloud"]["deadline_met"] == 1.0 and res["sdcloud-one-cloud"]["deadline_met"] == 1.0
    assert res["sdcloud"]["mean_cost"] < res["sdcloud-one-cloud"]["mean_cost"]
    assert res["sdcloud"]["moves"] >= res["sdcloud"]["jobs_moved"] > 0 and res["sdcloud-one-cloud"]["moves"] == 0
    # 7.1 CNY at the default 7.1 CNY per USD is 1 $/h: the rate is stated.
    assert "spot 1 $/h, on-demand 3 $/h (7.1/21.3 CNY/h at 0.1408 USD per CNY)" in captured.err


@pytest.mark.parametrize("extra,words", [
    (["--cloud-prices", "gcp:1:2"], "--cloud-prices names gcp, which no --trace"),
    (["--policy", "optimal"], "the optimal policy does not price moves"),
    (["--cloud-prices", "tencent:x:2"], "spot and on-demand must be numbers"),
])
def test_bad_two_cloud_options_are_refused_in_one_line(tmp_path, capsys, extra, words):
    a, b = _trace(tmp_path / "a.json", [1] * 40), _trace(tmp_path / "b.json", [1] * 40)
    assert main(["simulate", "--trace", f"aws:{a}", "--trace", f"tencent:{b}", "--job-hours", "1",
                 "--deadline-hours", "3", "--restart-hours", "0.2", *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err


def test_a_cloud_named_for_some_traces_only_is_refused(tmp_path, capsys):
    a, b = _trace(tmp_path / "a.json", [1] * 40), _trace(tmp_path / "b.json", [1] * 40)
    assert main(["simulate", "--trace", f"aws:{a}", "--trace", b, "--job-hours", "1",
                 "--deadline-hours", "3", "--restart-hours", "0.2"]) == 2
    assert "name the cloud of every --trace" in capsys.readouterr().err


SHARED_CELLS = [(48.0, 70.0), (48.0, 52.0)]


@pytest.mark.parametrize("c,r", SHARED_CELLS)
def test_moving_costs_less_than_one_cloud_with_on_demand_on_the_shared_traces(c, r, capsys):
    """AWS: the two us-west-2 V100 zones of the 2022 set with their spot price series; the second
    cloud: the 2023 us-east-2b V100 trace as a stand-in (no Tencent availability trace is public),
    priced as Tencent's V100 (GN10X.2XLARGE40, 19.03 CNY/h on-demand, spot estimated at 40% of it).
    A move: 10 GB at AWS's 0.09 $/GB egress, copied at 40 MB/s (offers/moves.py)."""
    from tests.conftest import shared_data

    one = shared_data("spot-traces", "aws-2022-10-26-1node")
    other = shared_data("spot-traces", "aws-2023-08-27-16node", "us-east-2b_v100_1.json")
    prices = shared_data("spot-prices", "v100_spot_prices.json")
    args = [
        "simulate", "--trace", f"aws:{one / 'us-west-2a_v100_1.json'}", "--trace", f"aws:{one / 'us-west-2b_v100_1.json'}",
        "--trace", f"tencent:{other}", "--tick", "600", "--prices", str(prices),
        "--cloud-prices", "tencent:7.612:19.03:CNY", "--job-hours", str(c), "--deadline-hours", str(r),
        "--restart-hours", "0.2", "--move-hours", "0.07", "--move-usd", "0.84", "--starts", "100",
        "--policy", "sdcloud-one-cloud", "--policy", "sdcloud", "--json"]
    assert main(args) == 0
    out = {x["policy"]: x for x in json.loads(capsys.readouterr().out)}
    assert out["sdcloud"]["deadline_met"] == 1.0 and out["sdcloud-one-cloud"]["deadline_met"] == 1.0
    assert out["sdcloud"]["mean_cost"] < out["sdcloud-one-cloud"]["mean_cost"]


def test_without_a_deadline_spot_gone_at_home_takes_the_other_clouds_spot_whatever_the_move_costs():
    from sdcloud.spot.policy import SPOT_REFUSALS

    dear = two_clouds(True, True, t=0.0, move_usd=50.0)  # the egress outweighs what the far spot saves
    dear.spot_refusals = SPOT_REFUSALS
    assert get_policy("sdcloud").decide(dear).kind == ON_DEMAND  # with a deadline: on-demand at home is cheaper
    dear.has_deadline = False  # without one the alternative is launching into the refusals until the fleet gives up
    assert get_policy("sdcloud").decide(dear).zone == "far-a"
