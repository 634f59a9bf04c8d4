"""`--simulate-preemption S` on a provider that can announce a reclaim on its own host (the local one).

The reclaim is announced S seconds after the first attempt's first trained step is seen, not after
its launch: it lands mid-training however long the host took to start (a first model build, a
loaded machine), which is what a user trying the reclaim path wants to watch.
"""

from __future__ import annotations

from ...providers.capabilities import SimulatesReclaim
from .owner import RunOwner
from ..records.state import Attempt


def on_progress(owner: RunOwner, provider: object, cur: Attempt, step: int) -> None:
    """Put the reclaim on its timer at the first step of the first attempt (once per driver)."""
    seconds = owner.spec.simulate_preemption
    if not seconds or cur.n != 1 or step < 1 or owner.memo.reclaim_scheduled:
        return
    if not isinstance(provider, SimulatesReclaim) or not cur.instance_id:
        return
    owner.memo.reclaim_scheduled = True
    provider.schedule_reclaim(cur.instance_id, seconds, events=lambda k, d: owner.event(k, {"attempt": 1, **d}))
