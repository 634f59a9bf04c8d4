"""Policy decisions one observation at a time, and deadlines on synthetic and real traces."""

from __future__ import annotations

import numpy as np
import pytest

from sdcloud.errors import UserError
from sdcloud.spot.policy import (ON_DEMAND, SPOT, WAIT, Observation, ZoneView, get_policy, policy_names)
from sdcloud.spot.simulate import Setting, load_trace, simulate, stack


def obs(t=0.0, p=0.0, zone=None, market=None, zones=(("a", True),), c=10.0, r=20.0, d=0.2, tick=1 / 6, prices=None):
    prices = prices or {}
    views = [ZoneView(k, up, prices.get(k, 1.0), 3.0) for k, up in zones]
    return Observation(t, p, c, r, d, zone, market, views, tick)


def test_registry():
    assert policy_names() == ["on-demand", "greedy", "uniform-progress", "sdcloud"]
    with pytest.raises(UserError, match="unknown policy 'x'; choose from: on-demand, greedy"):
        get_policy("x")


def test_uniform_progress_rules():
    up = get_policy("uniform-progress")
    # Spot available: take it.
    assert up.decide(obs()).kind == SPOT
    # No spot, ahead of ep(t) = C t / R = 2.5 at t = 5: wait; behind: on-demand.
    assert up.decide(obs(t=5, p=2.6, zones=(("a", False),))).kind == WAIT
    assert up.decide(obs(t=5, p=2.4, zones=(("a", False),))).kind == ON_DEMAND
    # On on-demand with spot back: leave only once p >= ep(t + 2d) = 0.5 (5.4) = 2.7.
    assert up.decide(obs(t=5, p=2.6, market=ON_DEMAND, zone="a")).kind == ON_DEMAND
    assert up.decide(obs(t=5, p=2.7, market=ON_DEMAND, zone="a")).kind == SPOT
    # Safety net: time left 5 < work left 4.7 + 0.4.
    assert up.decide(obs(t=15, p=5.3, market=SPOT, zone="a")).kind == ON_DEMAND


def test_greedy_rules():
    gr = get_policy("greedy")
    assert gr.decide(obs(t=5, p=0, zones=(("a", False),))).kind == WAIT
    assert gr.decide(obs(t=9.5, p=0, zones=(("a", True),))).kind == SPOT
    assert gr.decide(obs(t=9.7, p=0, zones=(("a", True),))).kind == ON_DEMAND
    # Once on on-demand, greedy stays there.
    assert gr.decide(obs(t=1, p=0.5, market=ON_DEMAND, zone="a")).kind == ON_DEMAND


def test_sdcloud_zones():
    sd = get_policy("sdcloud")
    two = (("a", True), ("b", True))
    # Running in b and b still has spot: stay (a hop costs a restart).
    assert sd.decide(obs(t=1, p=0.8, zone="b", market=SPOT, zones=two)) == sd.decide(obs(t=1, p=0.8, zone="b", market=SPOT, zones=two))
    assert sd.decide(obs(t=1, p=0.8, zone="b", market=SPOT, zones=two)).zone == "b"
    # Reclaimed in a: move to b, which has spot now, rather than wait.
    act = sd.decide(obs(t=1, p=0.8, zone="a", market=None, zones=(("a", False), ("b", True))))
    assert (act.kind, act.zone) == (SPOT, "b")
    # First launch: the cheapest zone with spot.
    act = sd.decide(obs(zones=two, prices={"a": 1.2, "b": 0.9}))
    assert (act.kind, act.zone) == (SPOT, "b")
    # After a wait the last zone wins a tie.
    assert sd.decide(obs(t=1, p=1, zone="b", zones=two)).zone == "b"
    # No spot anywhere and behind: on-demand; ahead: wait.
    none = (("a", False), ("b", False))
    assert sd.decide(obs(t=5, p=2.4, zones=none)).kind == ON_DEMAND
    assert sd.decide(obs(t=5, p=2.6, zones=none)).kind == WAIT


def test_sdcloud_safety_net_uses_the_tick():
    sd = get_policy("sdcloud")
    # time left 5 < work left 4.7 + 0.2 + max(0.2, 1/6) -> on-demand even with spot up.
    assert sd.decide(obs(t=15, p=5.3, market=SPOT, zone="a")).kind == ON_DEMAND
    assert sd.decide(obs(t=15, p=5.6, market=SPOT, zone="a")).kind == SPOT
    # A one-hour poll: the net widens to d + 1 h, where the paper's 2d would be too late.
    assert sd.decide(obs(t=15, p=5.6, market=SPOT, zone="a", tick=1.0)).kind == ON_DEMAND
    assert sd.decide(obs(t=15, p=6.3, market=SPOT, zone="a", tick=1.0)).kind == SPOT


def markov(rng, zones: int, n: int, p_fail: float, p_back: float) -> np.ndarray:
    """On/off availability: up -> down with p_fail per tick, down -> up with p_back."""
    out = np.zeros((zones, n), bool)
    state = rng.random(zones) < p_back / (p_fail + p_back)
    for k in range(n):
        out[:, k] = state
        flip = rng.random(zones)
        state = np.where(state, flip >= p_fail, flip < p_back)
    return out


@pytest.mark.parametrize("tick,d", [(600, 0.2), (300, 0.5), (3600, 0.2), (600, 0.0)])
def test_sdcloud_never_misses_on_random_markov_traces(tick, d):
    """Availability the policy was never shown: rare long outages, flapping, mostly down."""
    rng = np.random.default_rng(tick + int(d * 10))
    g = tick / 3600
    for p_fail, p_back in [(0.01, 0.01), (0.3, 0.3), (0.05, 0.5), (0.5, 0.05), (0.002, 0.02)]:
        for zones in (1, 3):
            avail = markov(rng, zones, int(200 / g), p_fail, p_back)
            for ratio in (0.5, 0.75, 0.95):
                c = 12.0
                r = max(c / ratio, c + d + 2 * g)
                st = Setting(c, r, d)
                res = simulate(avail, [f"z{i}" for i in range(zones)], tick, st, ["sdcloud"], starts=25, seed=3)[0]
                assert res.met.all(), (tick, d, p_fail, p_back, zones, ratio)


SETS = {
    "aws-2022-10-26-1node": ["us-west-2a_v100_1", "us-west-2b_v100_1"],
    "aws-2023-08-27-16node": ["us-east-2b_v100_1", "us-west-2a_v100_1", "us-west-2c_v100_1"],
    "preemption/aws-2023-08-03-4node": ["us-east-1f_v100_1", "us-east-2a_v100_1", "us-west-2c_v100_1"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SETS))
def test_sdcloud_on_the_shared_traces(name):
    from conftest import shared_data

    folder = shared_data("spot-traces", *name.split("/"))
    traces = [load_trace(folder / f"{stem}.json") for stem in SETS[name]]
    for ratio in (0.6, 0.7, 0.8, 0.9):
        st = Setting(48.0, 48.0 / ratio, 0.2)
        for i, t in enumerate(traces):
            avail, gap, keys = stack([t])
            res = {r.policy: r for r in simulate(avail, keys, gap, st, ["uniform-progress", "sdcloud"], starts=60, seed=5)}
            assert res["sdcloud"].met.all(), (name, keys, ratio)
            assert res["sdcloud"].savings.mean() >= res["uniform-progress"].savings.mean() - 1e-12, (name, keys, ratio)
        avail, gap, keys = stack(traces)
        res = {r.policy: r for r in simulate(avail, keys, gap, st, ["uniform-progress", "sdcloud"], starts=60, seed=5)}
        assert res["sdcloud"].met.all(), (name, ratio)
        assert res["sdcloud"].savings.mean() > res["uniform-progress"].savings.mean(), (name, ratio)
