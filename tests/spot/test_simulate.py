"""The simulator's accounting against cases computed by hand (docs/policies.md, "Accounting")."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from sdcloud.cli import main
from sdcloud.spot.policy import ON_DEMAND, SPOT, WAIT, Action, Policy, get_policy
from sdcloud.spot.simulate import (Setting, coarsen, load_trace, optimal_batch, optimal_costs, replay, simulate, stack,
                              Trace)

TICK = 600  # seconds: 1/6 h, so d = 0.2 h is 1.2 ticks and the partial tick is exercised
G = TICK / 3600
# Easy prices: spot 1 $/h, on-demand 3 $/h.
S, K = 1.0, 3.0
ONLINE = ["on-demand", "greedy", "uniform-progress", "sdcloud", "sdcloud-up"]


def setting(c: float, r: float, d: float = 0.2) -> Setting:
    return Setting(c, r, d, S, K)


def run_all(avail: np.ndarray, st: Setting, start: int = 0) -> dict:
    keys = [f"z{i}" for i in range(avail.shape[0])]
    out = {name: replay(get_policy(name), avail, keys, TICK, start, 0, st) for name in ONLINE}
    span = int(np.ceil(st.deadline_hours / G - 1e-9))
    cost, met = optimal_batch(avail, TICK, st, np.array([start]), np.array([0]), single_zone=False)
    out["optimal"] = (float(cost[0]), bool(met[0]))
    assert avail.shape[1] >= start + span
    return out


def test_always_available_spot_from_the_start():
    # Every spot policy: one launch (0.2 h) + 1 h of work on spot = 1.2 h at 1 $/h, done at 1.2 h.
    st = setting(1.0, 2.0)
    res = run_all(np.ones((1, 20), bool), st)
    for name in ("greedy", "uniform-progress", "sdcloud"):
        assert res[name].cost == pytest.approx(1.2)
        assert res[name].finish_hours == pytest.approx(1.2)
        assert res[name].spot_hours == pytest.approx(1.2) and res[name].ondemand_hours == 0
    assert res["on-demand"].cost == pytest.approx(3.6)  # 1.2 h at 3 $/h
    assert res["optimal"] == (pytest.approx(1.2), True)


def test_never_available():
    st = setting(1.0, 2.0)
    res = run_all(np.zeros((1, 20), bool), st)
    # Greedy waits while time left >= work left + 2d = 1.4 h: ticks at 0, 1/6, 2/6, 3/6; on-demand at 4/6.
    assert res["greedy"].cost == pytest.approx(3.6)
    assert res["greedy"].finish_hours == pytest.approx(4 * G + 1.2)
    # Uniform progress: behind ep(1/6) = 1/12 at the second tick, so on-demand from 1/6 h.
    for name in ("uniform-progress", "sdcloud-up"):
        assert res[name].finish_hours == pytest.approx(G + 1.2)
        assert res[name].cost == pytest.approx(3.6)
    # sdcloud waits while slack = 1 - t >= reserve = min(S (R - t)/R, 0.25 C) = 0.25 and >= the net
    # max(2d, d + tick) = 0.4: at 0 to 3/6 h; on-demand from 4/6 h. Waiting is free: the same 3.6 $.
    assert res["sdcloud"].finish_hours == pytest.approx(4 * G + 1.2)
    assert res["sdcloud"].cost == pytest.approx(3.6)
    assert res["optimal"] == (pytest.approx(3.6), True)
    assert all(res[n].deadline_met(st) for n in ONLINE)


def test_one_preemption():
    # Spot in every tick but tick 3 ([0.5 h, 0.667 h)). Slack is ample (R = 3 h) so all spot
    # policies wait out the gap: progress 0.3 h when reclaimed, a second launch at 4/6 h, and
    # 1.4 h of spot paid in all (C + 2d); finish = 1.4 h + one idle tick.
    avail = np.ones((1, 30), bool)
    avail[0, 3] = False
    st = setting(1.0, 3.0)
    res = run_all(avail, st)
    for name in ("greedy", "uniform-progress", "sdcloud"):
        assert res[name].cost == pytest.approx(1.4)
        assert res[name].finish_hours == pytest.approx(1.4 + G)
        assert res[name].launches == 2
    # The optimum knows the reclaim is coming: it waits for tick 4 and launches once, 1.2 h of spot.
    assert res["optimal"] == (pytest.approx(1.2), True)


def test_one_preemption_with_a_second_zone_moves_instead_of_waiting():
    avail = np.ones((2, 30), bool)
    avail[0, 3] = False
    st = setting(1.0, 3.0)
    keys = ["a", "b"]
    moved = replay(get_policy("sdcloud"), avail, keys, TICK, 0, 0, st)
    stayed = replay(get_policy("uniform-progress"), avail, keys, TICK, 0, 0, st)
    assert moved.cost == pytest.approx(1.4) and moved.finish_hours == pytest.approx(1.4)  # no idle tick
    assert stayed.finish_hours == pytest.approx(1.4 + G)


def test_deadline_forces_on_demand_at_the_start():
    # R = C + d: only a run with a single launch and no wait makes it. Online policies cannot
    # trust spot, so on-demand from t = 0: 1.2 h x 3 $/h. The optimum knows spot will stay.
    st = setting(1.0, 1.2)
    res = run_all(np.ones((1, 20), bool), st)
    for name in ONLINE:
        assert res[name].cost == pytest.approx(3.6)
        assert res[name].ondemand_hours == pytest.approx(1.2)
        assert res[name].deadline_met(st)
    assert res["optimal"] == (pytest.approx(1.2), True)
    # With a reclaim ahead the optimum must take on-demand too.
    avail = np.ones((1, 20), bool)
    avail[0, 3] = False
    assert run_all(avail, st)["optimal"] == (pytest.approx(3.6), True)


class Scripted(Policy):
    """Plays a fixed list of actions, one per tick (for brute force)."""

    name = "scripted"
    multi_zone = True

    def __init__(self, actions):
        self.actions = actions

    def decide(self, obs):
        k = round(obs.elapsed / obs.tick_hours)
        return self.actions[min(k, len(self.actions) - 1)]


@pytest.mark.parametrize("tick,d,zones", [(600, 0.2, 1), (300, 0.2, 1), (600, 0.1, 2), (600, 0.0, 1)])
def test_optimum_equals_brute_force(tick, d, zones):
    """The DP against every action sequence replayed through the same simulator."""
    rng = np.random.default_rng(tick + zones)
    g = tick / 3600
    st = Setting(0.5, 0.5 + 3 * g + 0.01, d, S, K)
    n = int(np.ceil(st.deadline_hours / g))
    choices = [Action(WAIT), Action(ON_DEMAND, "z0")] + [Action(SPOT, f"z{i}") for i in range(zones)]
    keys = [f"z{i}" for i in range(zones)]
    for _ in range(4):
        avail = rng.random((zones, n + 12)) < 0.6
        best = np.inf
        for seq in itertools.product(choices, repeat=n):
            try:
                out = replay(Scripted(list(seq) + [Action(ON_DEMAND, "z0")]), avail, keys, tick, 0, 0, st)
            except RuntimeError:
                continue  # spot chosen where there was none
            if out.deadline_met(st):
                best = min(best, out.cost)
        got = optimal_costs(avail[None, :, :n], tick, st)[0]
        assert got == pytest.approx(best, abs=1e-4)  # float32 DP


def test_optimum_is_a_lower_bound_for_every_policy_on_random_traces():
    rng = np.random.default_rng(7)
    avail = rng.random((2, 400)) < 0.5
    st = Setting(6.0, 9.0, 0.2, 0.9731, 3.06)
    for single in (True, False):
        res = {r.policy: r for r in simulate(avail, ["a", "b"], TICK, st, ONLINE + ["optimal"], starts=20, seed=1,
                                             single_zone=single)}
        assert res["optimal"].met.all()
        for name in ONLINE:
            assert (res["optimal"].costs <= res[name].costs + 1e-3).all()  # float32 DP


def test_coarsen_and_stack(tmp_path):
    t = Trace("z", 32, np.array([1, 1, 0, 1, 1, 1, 1, 1, 1, 1], bool))
    assert coarsen(t, 64).avail.tolist() == [True, False, True, True, True]
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    a.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [0, 3, 1]}))
    b.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1, 0]}))
    avail, gap, keys = stack([load_trace(a), load_trace(b)])
    assert gap == 600 and keys == ["a", "b"] and avail.tolist() == [[False, True], [True, False]]


def write(tmp_path, name, doc):
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(p)


def test_cli_json_and_table(tmp_path, capsys):
    f = write(tmp_path, "z1.json", {"metadata": {"gap_seconds": 600}, "data": [1] * 50})
    args = ["simulate", "--trace", f, "--job-hours", "1", "--deadline-hours", "2", "--restart-hours", "0.2",
            "--spot-price", "1", "--ondemand-price", "3", "--starts", "5"]
    assert main(args + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == ONLINE + ["optimal"]
    by = {r["policy"]: r for r in rows}
    assert by["sdcloud"]["mean_savings"] == pytest.approx(0.6) and by["sdcloud"]["deadline_met"] == 1.0
    assert by["sdcloud"]["mean_cost"] == pytest.approx(1.2) and by["sdcloud"]["starts"] == 5
    assert set(rows[0]) == {"policy", "mean_savings", "deadline_met", "mean_cost", "starts"}
    assert main(args + ["--policy", "greedy", "--single-zone"]) == 0
    out = capsys.readouterr().out
    assert "greedy" in out and "60.0%" in out and "sdcloud" not in out


@pytest.mark.parametrize("extra,message", [
    (["--job-hours", "0"], "--job-hours must be more than 0"),
    (["--deadline-hours", "0.5"], "impossible deadline"),
    (["--restart-hours", "-0.1"], "--restart-hours must be 0 or more"),
    (["--policy", "cheapest"],
     "unknown policy 'cheapest'; choose from: on-demand, greedy, uniform-progress, sdcloud, sdcloud-up, "
     "sdcloud-one-cloud, optimal"),
    (["--starts", "0"], "--starts must be at least 1"),
    (["--deadline-hours", "100"], "less than the deadline window"),
])
def test_cli_rejects_bad_input(tmp_path, capsys, extra, message):
    f = write(tmp_path, "z1.json", {"metadata": {"gap_seconds": 600}, "data": [1] * 50})
    base = {"--job-hours": "1", "--deadline-hours": "2", "--restart-hours": "0.2"}
    for i in range(0, len(extra), 2):
        base[extra[i]] = extra[i + 1]
    args = ["simulate", "--trace", f] + [x for kv in base.items() for x in kv]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("doc,message", [
    (None, "does not exist"),
    ("{not json", "is not readable JSON"),
    ({"data": [1, 0]}, "must be a JSON object with 'metadata'"),
    ({"metadata": {"gap_seconds": 0}, "data": [1]}, "gap_seconds must be a positive whole number"),
    ({"metadata": {"gap_seconds": 600}, "data": [1, "x"]}, "must be a non-empty list of numbers"),
    ({"metadata": {"gap_seconds": 600}, "data": []}, "must be a non-empty list of numbers"),
])
def test_cli_rejects_bad_traces(tmp_path, capsys, doc, message):
    f = str(tmp_path / "missing.json") if doc is None else write(tmp_path, "t.json", doc)
    assert main(["simulate", "--trace", f, "--job-hours", "1", "--deadline-hours", "2", "--restart-hours", "0.2"]) == 2
    assert message in capsys.readouterr().err


# Per-zone prices (docs/policies.md, "Prices"): C = 1 h, d = 0.2 h, 600 s ticks as above.


def test_each_zone_pays_its_own_spot_price():
    # Both zones always have spot; a costs 2 $/h, b 1 $/h. The job starts in a (start zone 0).
    avail = np.ones((2, 20), bool)
    prices = np.vstack([np.full(20, 2.0), np.full(20, 1.0)])
    st = setting(1.0, 2.0)
    keys = ["us-west-2a", "us-west-2b"]
    # sdcloud launches in the cheapest zone with spot: 1.2 h (restart included) at b's 1 $/h.
    moved = replay(get_policy("sdcloud"), avail, keys, TICK, 0, 0, st, spot_prices=prices)
    assert moved.cost == pytest.approx(1.2)
    # Uniform Progress keeps to a: the same 1.2 h, restart included, at a's 2 $/h.
    stayed = replay(get_policy("uniform-progress"), avail, keys, TICK, 0, 0, st, spot_prices=prices)
    assert stayed.cost == pytest.approx(2.4)
    cost, met = optimal_batch(avail, TICK, st, np.array([0]), np.array([0]), single_zone=False, spot_prices=prices)
    assert (float(cost[0]), bool(met[0])) == (pytest.approx(1.2), True)
    cost, _ = optimal_batch(avail, TICK, st, np.array([0]), np.array([0]), single_zone=True, spot_prices=prices)
    assert float(cost[0]) == pytest.approx(2.4)


def test_a_price_series_is_paid_tick_by_tick():
    # Spot 1 $/h in ticks 0-2, 2 $/h from tick 3. Launch at 0 (0.2 h restart), done at 1.2 h:
    # ticks 0-2 = 0.5 h at 1 $/h, then 0.7 h at 2 $/h = 0.5 + 1.4 = 1.9 $. Waiting only costs
    # more (the price rises), so the optimum pays the same.
    avail = np.ones((1, 20), bool)
    prices = np.where(np.arange(20) < 3, 1.0, 2.0)[None, :]
    st = setting(1.0, 2.0)
    out = replay(get_policy("sdcloud"), avail, ["z0"], TICK, 0, 0, st, spot_prices=prices)
    assert out.cost == pytest.approx(1.9) and out.finish_hours == pytest.approx(1.2)
    cost, _ = optimal_batch(avail, TICK, st, np.array([0]), np.array([0]), single_zone=True, spot_prices=prices)
    assert float(cost[0]) == pytest.approx(1.9, abs=1e-4)


def test_on_demand_is_priced_by_region_and_savings_against_it():
    # No spot: on-demand at the zone's region price, 5 $/h: 1.2 h x 5 = 6 $; savings against
    # C x 5 $/h = 1 - 6/5 = -20%, whatever the flat on-demand price says.
    avail = np.zeros((1, 20), bool)
    st = setting(1.0, 2.0)
    res = {r.policy: r for r in simulate(avail, ["eu-west-1a"], TICK, st, ["on-demand", "sdcloud", "optimal"],
                                         starts=3, ondemand_prices=np.array([5.0]))}
    for name in ("on-demand", "sdcloud", "optimal"):
        assert res[name].costs == pytest.approx(6.0, abs=1e-4)
        assert res[name].savings == pytest.approx(-0.2, abs=1e-5)


def test_optimum_with_prices_is_a_lower_bound():
    rng = np.random.default_rng(11)
    avail = rng.random((2, 400)) < 0.5
    prices = 0.8 + rng.random((2, 400))
    od = np.array([3.06, 2.5])
    st = Setting(6.0, 9.0, 0.2, 0.9731, 3.06)
    res = {r.policy: r for r in simulate(avail, ["us-east-1a", "eu-west-1b"], TICK, st, ONLINE + ["optimal"], starts=20,
                                         seed=2, spot_prices=prices, ondemand_prices=od)}
    assert res["optimal"].met.all()
    for name in ONLINE:
        assert (res["optimal"].costs <= res[name].costs + 1e-3).all()


def test_price_series_load_coarsen_and_attach(tmp_path):
    from sdcloud.errors import UserError
    from sdcloud.spot.simulate import region_of, stack_prices, with_prices

    f = tmp_path / "us-east-1c_v100_1.json"
    f.write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": [1, 1, 0, 1], "prices": [1.0, 2.0, 3.0, 5.0]}))
    t = load_trace(f)
    assert list(t.prices) == [1.0, 2.0, 3.0, 5.0]
    assert list(coarsen(t, 600).prices) == [1.5, 4.0]  # a coarse tick at the mean of its fine ones
    plain = Trace("us-west-2a_v100_1", 300, np.ones(4, bool))
    assert stack_prices([plain], 0.97) is None
    assert stack_prices([t, plain], 0.97).tolist() == [[1.0, 2.0, 3.0, 5.0], [0.97] * 4]
    assert list(with_prices(plain, [1.0, 2.0]).prices) == [1.0, 2.0, 2.0, 2.0]  # holds its last price
    assert list(with_prices(plain, [1, 2, 3, 4, 5]).prices) == [1, 2, 3, 4]
    assert (region_of("us-east-1c_v100_1"), region_of("eu-west-1a"), region_of("local")) == ("us-east-1", "eu-west-1", "local")
    f.write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": [1, 1], "prices": [1.0]}))
    with pytest.raises(UserError, match="'prices' must be a list of 2 non-negative numbers"):
        load_trace(f)


def test_sdcloud_waits_out_an_outage_uniform_progress_pays_for():
    # No spot in the first hour (ticks 0-5), spot from then on; C = 1 h, R = 3 h, d = 0.2 h.
    avail = np.ones((1, 30), bool)
    avail[0, :6] = False
    st = setting(1.0, 3.0)
    res = run_all(avail, st)
    # Uniform Progress is behind ep(1/6) at the second tick: on-demand from 1/6 h to 1 h (5 ticks,
    # 2.5 $, progress 5/6 - 0.2 = 0.633 h); at 1 h p >= ep(1 + 2d) = 0.467: spot, 0.2 h restart then
    # the 0.367 h left: 0.567 h at 1 $/h. 3.067 $, done at 1.567 h, two launches.
    up = res["uniform-progress"]
    assert up.cost == pytest.approx(2.5 + 0.2 + 0.3667, abs=1e-3) and up.launches == 2
    # sdcloud: reserve = min(S (R - t)/R, 0.25 (C - p)) = 0.25 h with p = 0, and slack = 2 - t >=
    # max(0.25, net 0.4) until t = 1.6 h: it waits through tick 5, launches spot at 1 h once:
    # 1.2 h at 1 $/h, done at 2.2 h, as the optimum.
    sd = res["sdcloud"]
    assert sd.cost == pytest.approx(1.2) and sd.finish_hours == pytest.approx(2.2) and sd.launches == 1
    assert res["optimal"] == (pytest.approx(1.2), True)


def test_cli_prices_from_the_trace_and_from_a_file(tmp_path, capsys):
    # Zone a carries its own series (2 $/h); b gets 1 $/h from --prices: sdcloud and the optimum run in b,
    # 1.2 h at 1 $/h = 1.2 $, savings 1 - 1.2 / (1 h x 3 $/h) = 60%.
    a = write(tmp_path, "a.json", {"metadata": {"gap_seconds": 600}, "data": [1] * 50, "prices": [2.0] * 50})
    b = write(tmp_path, "b.json", {"metadata": {"gap_seconds": 600}, "data": [1] * 50})
    prices = write(tmp_path, "prices.json", {"b": [1.0, 1.0], "a": [9.0]})  # a's own series wins
    args = ["simulate", "--trace", a, "--trace", b, "--job-hours", "1", "--deadline-hours", "2", "--restart-hours",
            "0.2", "--ondemand-price", "3", "--starts", "4", "--policy", "sdcloud", "--policy", "optimal", "--json"]
    assert main(args + ["--prices", prices]) == 0
    rows = {r["policy"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["sdcloud"]["mean_cost"] == pytest.approx(1.2) and rows["optimal"]["mean_cost"] == pytest.approx(1.2, abs=1e-4)
    assert rows["sdcloud"]["mean_savings"] == pytest.approx(0.6)
    bad = write(tmp_path, "bad.json", {"b": []})
    assert main(args + ["--prices", bad]) == 2
    assert capsys.readouterr().err.strip().endswith("must map trace names to non-empty lists of non-negative prices")


def test_refused_spot_launches_are_replayed_and_send_the_job_on_demand(tmp_path):
    from sdcloud.spot.policy import SPOT_REFUSALS
    from sdcloud.spot.simulate import stack_refused

    # Spot shows all along, but every launch is refused: the tick passes unpaid, and after
    # SPOT_REFUSALS refusals in a row the job goes on-demand (it would wait for spot otherwise).
    n = 60
    f = write(tmp_path, "z.json", {"metadata": {"gap_seconds": TICK}, "data": [1] * n, "refused": [1] * n})
    trace = load_trace(f)
    assert trace.refused.all() and coarsen(trace, 2 * TICK).refused.tolist() == [True] * (n // 2)
    avail, _, keys = stack([trace])
    refused = stack_refused([trace])
    st = setting(1.0, 6.0)
    out = replay(get_policy("sdcloud"), avail, keys, TICK, 0, 0, st, refused=refused)
    assert out.spot_hours == 0 and out.launches == 1
    assert out.finish_hours == pytest.approx(SPOT_REFUSALS * G + 1.0 + 0.2)
    assert out.cost == pytest.approx(1.2 * K)
    # Without the signal nothing changes: spot from the first tick.
    plain = replay(get_policy("sdcloud"), avail, keys, TICK, 0, 0, st)
    assert plain.ondemand_hours == 0 and plain.cost == pytest.approx(1.2 * S)
    assert stack_refused([Trace("a", TICK, np.ones(3, bool))]) is None
