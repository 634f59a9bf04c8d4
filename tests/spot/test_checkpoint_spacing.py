"""Checkpoints spaced by the reclaim risk (Young/Daly): the host's decision, the control plane's mean
time between reclaims, and the simulator's loss at a reclaim whose notice save is not durable."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sdcloud.spot.checkpoint_spacing import (band_mean_hours, expected_overhead, mean_hours_between_reclaims,
                                             young_daly_hours)
from sdcloud.spot.policy import get_policy
from sdcloud.spot.simulate import Setting, replay
from sdcloud_agent.checkpoint_spacing import checkpoint_every, save_fits_notice, young_daly_seconds

# The largest tier, sdxl-finetune (docs/policies.md "Checkpoints spaced by risk"): the trainer's state
# is the UNet's 2.57 B parameters in fp32 (10.3 GB; Adafactor's factored moments are small) and the
# model file in fp16 (6.9 GB): about 17 GB a save. Local write at 1 GB/s (17 s), upload at the
# agent's measured 135.6 MB/s (docs/host-agent.md, the CRT engine's median): 126 s. 143 s in all.
SAVE_S = 17.0 + 17_000 / 135.6
SHORT_NOTICE_S = 30.0  # GCP's preemption notice; AWS gives 120 s, which this save does not fit either


def test_the_host_decides_from_its_measured_save_time():
    # A LoRA's save (5 s) fits a 2-minute notice with margin: the run's interval stays.
    assert save_fits_notice(5.0, 120.0)
    assert checkpoint_every(every=500, step_s=1.0, save_s=5.0, notice_s=120.0, mean_s=7200.0).every == 500
    # 1.5 x save + 10 s must fit in 120 s: 74 s does not (121 s), 73 s does (119.5 s).
    assert save_fits_notice(73.0, 120.0) and not save_fits_notice(74.0, 120.0)
    assert not save_fits_notice(1.0, None) and not save_fits_notice(1.0, 0.0)
    # The largest tier on a short notice: sqrt(2 x 143 x 7200) = 1435 s; 1.2 s steps -> 1195 steps.
    sp = checkpoint_every(every=2000, step_s=1.2, save_s=SAVE_S, notice_s=SHORT_NOTICE_S, mean_s=7200.0)
    tau = math.sqrt(2 * SAVE_S * 7200)
    assert sp.every == int(tau / 1.2) and 1100 < sp.every < 1300, sp
    assert "Young/Daly" in sp.why
    # Never longer than the run's own interval; unknown figures keep it.
    assert checkpoint_every(every=300, step_s=1.2, save_s=SAVE_S, notice_s=30.0, mean_s=7200.0).every == 300
    assert checkpoint_every(every=300, step_s=None, save_s=SAVE_S, notice_s=30.0, mean_s=7200.0).every == 300
    assert young_daly_seconds(SAVE_S, 7200.0) == pytest.approx(3600 * young_daly_hours(SAVE_S / 3600, 2.0))
    with pytest.raises(ValueError):
        young_daly_seconds(0.0, 7200.0)


def test_the_mean_between_reclaims_from_the_band_and_what_was_seen():
    # The catalog's reclaim rates per alive hour (0.05 ... 0.5): band 0 -> 20 h ... band 4 -> 2 h.
    assert [round(band_mean_hours(b), 1) for b in range(5)] == [20.0, 6.7, 4.0, 2.9, 2.0]
    assert band_mean_hours(None) == band_mean_hours(2)  # no band published: the middle one
    with pytest.raises(ValueError):
        band_mean_hours(5)
    assert mean_hours_between_reclaims(4) == pytest.approx(2.0)
    # Three reclaims in 3 h of spot in a band-1 zone: (3 + 6.7) / 4 = 2.4 h, far below the band's 6.7.
    assert mean_hours_between_reclaims(1, reclaims=3, spot_hours=3.0) == pytest.approx((3 + 1 / 0.15) / 4)
    # No reclaim in 40 h: longer than the band says.
    assert mean_hours_between_reclaims(4, reclaims=0, spot_hours=40.0) == pytest.approx(42.0)
    # Young's interval minimises the first-order overhead.
    s, m = SAVE_S / 3600, 2.0
    tau = young_daly_hours(s, m)
    assert expected_overhead(tau, s, m) < min(expected_overhead(tau * f, s, m) for f in (0.5, 0.8, 1.25, 2.0))


def spot_trace(rng: np.random.Generator, hours: float, tick_s: int, mean_up_h: float, mean_down_h: float) -> np.ndarray:
    """Spot up for exponential spells of mean_up_h (reclaims at that mean), down for mean_down_h."""
    g = tick_s / 3600
    out = np.zeros((1, int(hours / g)), bool)
    state = True
    for k in range(out.shape[1]):
        out[0, k] = state
        state = rng.random() >= g / mean_up_h if state else rng.random() < g / mean_down_h
    return out


def test_a_largest_tier_run_on_a_short_notice_loses_at_most_one_interval_per_reclaim():
    """sdxl-finetune (143 s a save) in a band-4 zone (2 h between reclaims) with a 30 s notice: the
    save at the notice is not durable, so each reclaim loses the work since the last periodic
    checkpoint. Spaced by Young/Daly (24 min) that is at most one interval a reclaim; it costs less
    than a fixed interval of the run's default (an eighth of the job: 3 h) or a short one (5 min),
    and every deadline is met."""
    tick = 300
    rng = np.random.default_rng(7)
    avail = spot_trace(rng, 600.0, tick, mean_up_h=2.0, mean_down_h=0.5)
    save, notice = SAVE_S / 3600, SHORT_NOTICE_S / 3600
    mean = mean_hours_between_reclaims(4)
    tau = young_daly_hours(save, mean)
    assert 0.35 < tau < 0.45
    costs = {}
    for label, every in (("young-daly", tau), ("fixed 3 h", 3.0), ("fixed 5 min", 5 / 60)):
        st = Setting(24.0, 40.0, 0.2, 1.0, 3.0, save_hours=save, notice_hours=notice, checkpoint_hours=every)
        policy = get_policy("sdcloud")
        outs = [replay(policy, avail, ["z"], tick, s, 0, st) for s in range(0, 6000, 200)]
        assert all(o.deadline_met(st) for o in outs), label
        reclaims = sum(o.reclaims for o in outs)
        lost = sum(o.lost_hours for o in outs)
        assert reclaims > 20 and lost > 0, label
        # No reclaim can lose more than one interval of work: the loss is the work since the last durable save.
        assert lost <= reclaims * every + 1e-9, label
        costs[label] = float(np.mean([o.cost for o in outs]))
    assert costs["young-daly"] < costs["fixed 3 h"] and costs["young-daly"] < costs["fixed 5 min"], costs
    # The default accounting (no notice given): the notice save is durable, nothing is lost.
    st = Setting(24.0, 40.0, 0.2, 1.0, 3.0, save_hours=save)
    out = replay(get_policy("sdcloud"), avail, ["z"], tick, 0, 0, st)
    assert out.lost_hours == 0
    # A save that fits the notice loses nothing either, whatever the interval.
    st = Setting(24.0, 40.0, 0.2, 1.0, 3.0, save_hours=20 / 3600, notice_hours=notice, checkpoint_hours=3.0)
    assert replay(get_policy("sdcloud"), avail, ["z"], tick, 0, 0, st).lost_hours == 0


def test_the_agent_config_carries_the_notice_and_the_mean(sdcloud_home):
    from types import SimpleNamespace

    from sdcloud.runs.inputs.agent_config import agent_config
    from sdcloud.runs.inputs.spec import build_spec
    from sdcloud.spot.checkpoint_spacing import zone_mean_hours
    from sdcloud_agent.config import from_dict

    spec = build_spec(None, {"tier": "sdxl-finetune", "provider": "aws", "region": "us-east-1"})
    # Two reclaims in 3 h of spot in us-east-1a, band 4: (3 + 2) / 3 h; the other zone's attempt does not count.
    seen = [SimpleNamespace(market="spot", zone="us-east-1a", hours=1.0, end_reason="preempted"),
            SimpleNamespace(market="spot", zone="us-east-1a", hours=2.0, end_reason="preempted"),
            SimpleNamespace(market="spot", zone="us-east-1b", hours=9.0, end_reason="succeeded"),
            SimpleNamespace(market="on-demand", zone="us-east-1a", hours=5.0, end_reason="switched")]
    mean = zone_mean_hours(4, seen, "us-east-1a")
    assert mean == pytest.approx(5 / 3)
    cfg = agent_config(spec, "r1", 3, 20_000, {"url": "file:///tmp/x"}, reclaim_mean_hours=mean)
    assert cfg["reclaim_notice_seconds"] == 120.0 and cfg["reclaim_mean_seconds"] == 6000
    agent = from_dict(cfg)
    assert (agent.reclaim_notice_seconds, agent.reclaim_mean_seconds) == (120.0, 6000)
    # The largest tier's save (143 s) does not fit AWS's two minutes with margin: Young/Daly spacing,
    # sqrt(2 x 143 x 6000) = 1307 s = 261 steps of 5 s, where the run's default is 500.
    sp = checkpoint_every(every=agent.checkpoint_every, step_s=5.0, save_s=SAVE_S,
                          notice_s=agent.reclaim_notice_seconds, mean_s=agent.reclaim_mean_seconds)
    assert agent.checkpoint_every == 500 and sp.every == int(math.sqrt(2 * SAVE_S * 6000) / 5.0) == 261
    # On-demand: no reclaim, nothing sent.
    od = build_spec(None, {"tier": "sdxl-finetune", "provider": "aws", "region": "us-east-1", "market": "on-demand"})
    assert "reclaim_mean_seconds" not in agent_config(od, "r2", 1, 1000, {"url": "file:///tmp/x"}, reclaim_mean_hours=None)
