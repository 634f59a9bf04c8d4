"""A run whose host ended itself while nobody drove it, closed as what it is (`sdcloud status` asks).

After its controller died, a host ends itself (sdcloud_agent/selfend.py): after its grace once its
work is over, or when no driver has stepped the run for a while. Until some driver looks, the
run would read `running` with a stale step and a cost that keeps rising.
"""

from __future__ import annotations

import json

from ..runs.driving.host_status import status_key
from ..runs.records.run_state import RunState
from ..runs.records.state import StateStore


def settle_self_ended(state: StateStore, run: dict) -> bool:
    """A run that nobody drives whose host ended itself (sdcloud_agent/selfend.py, after its
    controller died) is closed as what it is: its attempt ended at the host's own end time (so its
    cost stops there), the run succeeded when the host had finished, else stopped with its checkpoint
    kept. Done under the run's lease, as any driver acts; False when there was nothing to settle
    (or a driver holds the run: it settles it itself)."""
    from ..offers.kinds import RunKind
    from ..runs.driving.background import controller_alive
    from ..runs.records.state import ACTIVE_RUN_STATES, run_kind
    from ..runs.records.store_of import store_of

    if run_kind(run) is not RunKind.TRAIN or run["state"] not in ACTIVE_RUN_STATES or controller_alive(run):
        return False
    try:
        doc = json.loads(store_of(run).get(status_key(run["id"])))
    except Exception:  # noqa: BLE001 - no status yet, no store: nothing to settle
        return False
    se = doc.get("self_end") if isinstance(doc, dict) else None
    if not isinstance(se, dict) or not se.get("at") or se.get("error"):
        return False
    from ..runs.driving.controller import Controller

    ctl = Controller(state, run["id"])
    if not ctl.lease.acquire():
        return False
    try:
        cur = ctl.current()
        if cur is None or doc.get("attempt") != cur.n:
            return False
        if doc.get("phase") == "succeeded":
            ctl.end_attempt(cur, "succeeded")
            ctl.end_run(RunState.SUCCEEDED, None)
        else:
            ctl.end_attempt(cur, "self-ended")
            ctl.end_run(RunState.STOPPED, f"its host ended itself ({se.get('reason')}"
                                   f"{', nobody drove the run' if se.get('unattended') else ''}); checkpoint kept in the bucket")
        return True
    finally:
        ctl.finish_driving()
