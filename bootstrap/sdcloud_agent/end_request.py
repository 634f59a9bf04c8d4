"""An end asked through the run's bucket: `runs/<id>/end/<attempt>.json`, written by a driver whose
machine cannot reach this host's instance (a local host of another machine, a box it has no keys
for), so that `sdcloud down` from any machine ends the host that actually trains. The host takes
it as a notice: it saves, uploads its checkpoint, reports `preempted` with `ended_by: driver`, and
ends itself, as after a cloud's reclaim notice.

Standard library only (it runs beside the other watchers of the agent).
"""

from __future__ import annotations

import json
import time

from .watchers import Notice

# Seconds a host asked to end gives its trainer and the last upload (the driver waits a little longer).
END_GRACE_S = 90.0
ENDED_BY = "driver"


def end_key(run_prefix: str, attempt: int) -> str:
    return f"{run_prefix}/end/{int(attempt)}.json"


def ask(store, run_prefix: str, attempt: int, by: str, reason: str) -> None:
    """The driver's side: ask attempt `attempt`'s host to save and end."""
    doc = {"attempt": int(attempt), "by": by, "reason": reason, "time": time.time()}
    store.put(end_key(run_prefix, attempt), json.dumps(doc).encode())


class EndRequestWatcher:
    """A watcher (watchers.WatchThread) whose notice is an end asked for this attempt in the bucket."""

    def __init__(self, store, run_prefix: str, attempt: int, on_asked=None):
        self.store, self.key, self.on_asked = store, end_key(run_prefix, attempt), on_asked

    def check(self) -> list[Notice]:
        try:
            doc = json.loads(self.store.get(self.key))
        except Exception:  # noqa: BLE001 - none asked (NotFound), or unreadable now: asked again next poll
            return []
        if self.on_asked is not None:
            self.on_asked(doc)
        now = time.time()
        why = f"asked to end by {doc.get('by') or 'its driver'}: {doc.get('reason') or 'stopped'}"
        return [Notice("terminate", now + END_GRACE_S, now, why)]
