"""Periodic checkpoints spaced by the reclaim risk (Young/Daly), decided on the host.

The control plane sends, in the agent config, `reclaim_notice_seconds` (the provider's notice) and
`reclaim_mean_seconds` (the mean time between reclaims of the zone: its catalog band, sharpened by
the reclaims the run has seen; sdcloud/spot/checkpoint_spacing.py). The host measures what a
durable save takes here: the local write plus the upload.

- If the save fits in the notice with margin (save x NOTICE_MARGIN + NOTICE_SLACK_S <= notice),
  the save at the notice is durable and a reclaim loses only the restart: the periodic interval
  stays what the run asked for.
- If not, every reclaim loses the work since the last durable periodic checkpoint, so the interval
  is Young's optimum, tau = sqrt(2 x save x mean between reclaims), which minimises the time spent
  saving plus the expected work lost (Young, CACM 1974; Daly, FGCS 2006). It is never longer than
  the run's own interval: a run that asked for frequent checkpoints keeps them.

The margin: measured save times move with the disk's and the link's load (the agent's own upload
benchmark saw 0.78x to 1.03x of its median across runs on one machine, docs/host-agent.md), so the
save must fit one and a half times over, with 10 s more for the notice's detection (the watchers
poll every few seconds) and the trainer's stop.

Pure arithmetic, no imports from the control plane (this runs on the host's Python 3.10).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NOTICE_MARGIN = 1.5
NOTICE_SLACK_S = 10.0


def save_fits_notice(save_s: float, notice_s: float | None) -> bool:
    """Whether a save started at the notice is durable before the host goes."""
    if notice_s is None or notice_s <= 0:
        return False  # no notice at all: nothing is saved at a reclaim
    return save_s * NOTICE_MARGIN + NOTICE_SLACK_S <= notice_s


def young_daly_seconds(save_s: float, mean_s: float) -> float:
    """sqrt(2 x save x mean time between reclaims), in seconds."""
    if save_s <= 0 or mean_s <= 0:
        raise ValueError("save time and mean time between reclaims must be positive")
    return math.sqrt(2.0 * save_s * mean_s)


@dataclass(frozen=True)
class Spacing:
    every: int  # steps between periodic checkpoints
    why: str


def checkpoint_every(*, every: int, step_s: float | None, save_s: float | None, notice_s: float | None,
                     mean_s: float | None) -> Spacing:
    """The periodic interval in steps: the run's own `every`, or fewer steps where the notice save
    cannot be durable and Young's optimum is shorter. Unknown figures keep `every`."""
    if not step_s or step_s <= 0 or not save_s or save_s <= 0 or not mean_s or mean_s <= 0:
        return Spacing(every, "no measured step or save time, or no reclaim rate: the run's interval")
    if save_fits_notice(save_s, notice_s):
        return Spacing(every, f"a save ({save_s:.0f} s) is durable within the notice ({notice_s:.0f} s)")
    tau = young_daly_seconds(save_s, mean_s)
    steps = max(1, int(tau / step_s))
    if steps >= every:
        return Spacing(every, f"Young/Daly interval {tau:.0f} s is longer than the run's {every} steps")
    return Spacing(steps, f"save {save_s:.0f} s does not fit the notice ({notice_s or 0:.0f} s): "
                          f"Young/Daly interval sqrt(2 x {save_s:.0f} x {mean_s:.0f}) = {tau:.0f} s = {steps} steps")
