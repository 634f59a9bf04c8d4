"""A stop asked through a run's bucket: `runs/<id>/stop.json`, written by `sdcloud down` on a machine
that does not drive the run, read by whichever driver holds its lease at its next step
(Controller.step), which ends the host and then deletes it.
"""

from __future__ import annotations

import json
import time
from typing import Any


def stop_key(run_id: str) -> str:
    return f"runs/{run_id}/stop.json"


def request(store: Any, run_id: str, by: str, reason: str) -> None:
    """Ask whoever drives the run to stop it (one small object in its bucket)."""
    store.put(stop_key(run_id), json.dumps({"by": by, "reason": reason, "time": time.time()}).encode())


def requested(store: Any, run_id: str, since: float = 0.0) -> dict | None:
    """A stop request made after `since` (the run's last resume), or None. A store fault reads as none:
    the driver reads it again at its next step."""
    from .store import NotFound, StoreError

    try:
        doc = json.loads(store.get(stop_key(run_id)))
    except (NotFound, StoreError, OSError, ValueError):
        return None
    if not isinstance(doc, dict) or float(doc.get("time") or 0.0) < since:
        return None
    return doc


def clear(store: Any, run_id: str) -> None:
    from .store import StoreError

    try:
        store.delete(stop_key(run_id))
    except (StoreError, OSError):
        pass  # a request older than the run's next resume is ignored anyway (requested's `since`)
