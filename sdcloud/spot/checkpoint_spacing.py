"""How often a run should checkpoint on spot: the control plane's half of the Young/Daly spacing.

Where the save at a reclaim notice is durable before the host goes (local write + upload within
the notice), a reclaim loses nothing but the restart, and the periodic interval only bounds what a
host that vanishes without notice costs. Where it is not (a large model, a slow disk or link, a
short notice), every reclaim loses the work since the last durable periodic checkpoint. The
interval that minimises the expected loss plus the time spent saving is Young's first-order
optimum, tau = sqrt(2 x save time x mean time between reclaims) (Young, CACM 1974; Daly, FGCS
2006, adds higher-order terms that matter only when the save is a sizeable part of the mean).

The host measures its own save time; the control plane knows the mean time between reclaims: the
zone's catalog band as a prior, sharpened by the reclaims the run has seen there. It sends the mean
and the provider's notice in the agent config (runs/inputs/agent_config.py); the host decides
(sdcloud_agent/checkpoint_spacing.py, which must not import this package and so carries the same
few lines of arithmetic). The simulator uses `young_daly_hours` for the same interval.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from ..offers.catalog import BAND_RECLAIMS_PER_HOUR, DEFAULT_BAND

# How many reclaims the band's prior is worth: one. A run that has seen three reclaims in two hours
# of spot is told about a mean near its own, not the band's.
PRIOR_RECLAIMS = 1.0


def band_mean_hours(band: int | None) -> float:
    """Mean hours between reclaims of a spot host kept alive, from the advisor band (0: <5% a month
    ... 4: >20%). The band's monthly figure is fleet-wide; the per-alive-hour rates are the catalog's
    (offers/catalog.py BAND_RECLAIMS_PER_HOUR, calibrated on the shared preemption traces):
    band 0 -> 20 h, 1 -> 6.7 h, 2 -> 4 h, 3 -> 2.9 h, 4 -> 2 h. No band: the middle one."""
    b = DEFAULT_BAND if band is None else band
    if not 0 <= b < len(BAND_RECLAIMS_PER_HOUR):
        raise ValueError(f"interruption band must be 0..{len(BAND_RECLAIMS_PER_HOUR) - 1}, got {band}")
    return 1.0 / BAND_RECLAIMS_PER_HOUR[b]


def mean_hours_between_reclaims(band: int | None, reclaims: int = 0, spot_hours: float = 0.0) -> float:
    """The band's mean, sharpened by what the run saw in the zone: `reclaims` in `spot_hours` of
    spot (a Gamma prior on the rate worth PRIOR_RECLAIMS reclaims at the band's rate)."""
    if reclaims < 0 or spot_hours < 0:
        raise ValueError("reclaims and spot hours must be 0 or more")
    prior = band_mean_hours(band)
    return (spot_hours + PRIOR_RECLAIMS * prior) / (reclaims + PRIOR_RECLAIMS)


def young_daly_hours(save_hours: float, mean_hours: float) -> float:
    """Young's optimum interval between durable checkpoints: sqrt(2 x save x mean), in hours."""
    if save_hours <= 0 or mean_hours <= 0:
        raise ValueError("save time and mean time between reclaims must be positive")
    return math.sqrt(2.0 * save_hours * mean_hours)


def expected_overhead(interval_hours: float, save_hours: float, mean_hours: float, restart_hours: float = 0.0) -> float:
    """First-order share of time lost with checkpoints every `interval_hours` of work: the saves
    (save / interval) plus, per reclaim, half an interval of lost work and the restart."""
    return save_hours / interval_hours + (interval_hours / 2 + save_hours + restart_hours) / mean_hours


def zone_mean_hours(band: int | None, attempts: Iterable[Any], zone: str | None) -> float:
    """The mean for a launch in `zone`: the band's, sharpened by the run's spot attempts there (an
    attempt ended "preempted" is a reclaim; its hours are hours of spot seen). `zone` None (a
    price for every zone of the region): all the run's spot attempts count."""
    reclaims, hours = 0, 0.0
    for a in attempts:
        if a.market != "spot" or (zone is not None and a.zone != zone):
            continue
        hours += a.hours
        reclaims += a.end_reason == "preempted"
    return mean_hours_between_reclaims(band, reclaims, hours)
