"""The spot policy on a multi-node group: the group is one unit, its price N x the host's in every
zone and its restart N hosts' restart. Every policy decides on such a group as on one host (the same
market and zone), so the fleet may hand it either the host's or the group's prices."""

from __future__ import annotations

import itertools

from sdcloud.spot.policy import POLICIES, Observation, ZoneView, get_policy


def _obs(scale: float, market, zone, spot_ok: bool, elapsed: float, progress: float) -> Observation:
    zones = [ZoneView("aws/us-east-1/us-east-1a/g5.12xlarge", spot_ok, 2.1 * scale, 5.67 * scale),
             ZoneView("aws/us-east-1/us-east-1b/g5.12xlarge", True, 2.6 * scale, 5.67 * scale)]
    return Observation(elapsed=elapsed, progress=progress, job_hours=10.0, deadline_hours=16.0, restart_hours=0.2,
                       zone=zone, market=market, zones=zones, tick_hours=5 / 3600)


def test_every_policy_decides_a_group_as_one_host():
    seen = 0
    for name in POLICIES:
        for market, zone, spot_ok, elapsed, progress in itertools.product(
                (None, "spot", "on-demand"), (None, "aws/us-east-1/us-east-1a/g5.12xlarge"), (True, False),
                (0.0, 3.0, 9.0), (0.0, 2.5, 6.0)):
            one = get_policy(name).decide(_obs(1, market, zone, spot_ok, elapsed, progress))
            group = get_policy(name).decide(_obs(4, market, zone, spot_ok, elapsed, progress))
            assert (one.kind, one.zone) == (group.kind, group.zone), (name, market, zone, spot_ok, elapsed, progress)
            seen += 1
    assert seen == len(POLICIES) * 3 * 2 * 2 * 3 * 3
