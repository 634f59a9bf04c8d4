"""The host ends itself when its work is over and nobody ended it (docs/host-agent.md, "Self-end").

A host ends only when the controller on the user's machine tells it to; when that process is gone
(a laptop asleep, a closed terminal, a crash) a finished host would bill until the user came back.
So after the agent's terminal phase the host waits a grace period for the controller, then ends
itself; a run whose controller's heartbeat (`runs/<id>/controller.json`) is stale is `unattended`
and ends at once. A lifetime cap, from the run's budget at this host's price or its deadline plus a
margin (or twice the estimate plus two hours), makes a host that never reaches its end save and end.

How a host ends is its cloud's (clouds/<kind>.py, asked by `self_end.provider`): AWS shuts the OS
down, Tencent calls its own TerminateInstances; a box over SSH is the user's own and a local host
is this machine, so there the end is recorded (status.json's `self_end`) and the agent exits.

Standard library only: it also runs from the user-data's failure path (`python -m sdcloud_agent.selfend`).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field, fields
from typing import Callable

from . import clouds

log = logging.getLogger("sdcloud_agent.selfend")

DEFAULT_GRACE_S = 600.0
# A deadline's cap leaves this much after it: the controller's own deadline fallback comes first.
DEADLINE_MARGIN_S = 3600.0
# A run with neither budget nor deadline: twice the estimate plus two hours.
CAP_ESTIMATE_FACTOR = 2.0
CAP_EXTRA_S = 7200.0


@dataclass
class SelfEnd:
    """What the controller tells the host about ending itself (the agent config's `self_end`)."""
    provider: str = "none"  # aws | tencent | ssh | local | none
    grace_s: float = DEFAULT_GRACE_S
    # The controller's heartbeat older than this: the run is unattended (None: never judged).
    unattended_after_s: float | None = None
    price_per_hour: float | None = None  # USD, this host's rate
    budget_left: float | None = None  # USD left of the run's budget at launch
    deadline_at: float | None = None  # epoch seconds
    estimate_hours: float | None = None
    launched_at: float | None = None  # epoch seconds: the cap counts from here
    region: str | None = None
    cap_s: float | None = field(default=None)  # an explicit cap (tests, or a user's override)

    @classmethod
    def from_dict(cls, d: dict | None) -> "SelfEnd":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (d or {}).items() if k in known})

    @property
    def ends_machine(self) -> bool:
        return clouds.for_provider(self.provider).ENDS_MACHINE


def lifetime_cap(se: SelfEnd) -> tuple[float, str]:
    """(seconds from launch, why): the budget at this host's price, the deadline plus a margin,
    whichever comes first; with neither, twice the estimate plus two hours."""
    if se.cap_s is not None:
        return float(se.cap_s), "the run's lifetime cap"
    caps = []
    if se.budget_left is not None and se.price_per_hour:
        caps.append((max(0.0, se.budget_left) / se.price_per_hour * 3600.0,
                     f"the budget left (${se.budget_left:.2f} at ${se.price_per_hour:.4f}/h)"))
    if se.deadline_at is not None and se.launched_at is not None:
        caps.append((max(0.0, se.deadline_at + DEADLINE_MARGIN_S - se.launched_at), "the deadline plus one hour"))
    if caps:
        return min(caps)
    est = se.estimate_hours if se.estimate_hours and se.estimate_hours > 0 else 1.0
    return CAP_ESTIMATE_FACTOR * est * 3600.0 + CAP_EXTRA_S, f"twice the estimate ({est:.2f} h) plus two hours"


# -- the controller's heartbeat ---------------------------------------------------------------------

def controller_key(run_prefix: str) -> str:
    return f"{run_prefix}/controller.json"


def controller_age(store, run_prefix: str, now: float) -> float | None:
    """Seconds since the controller's last heartbeat; None when it never wrote one or it cannot be read."""
    try:
        doc = json.loads(store.get(controller_key(run_prefix)))
        return max(0.0, now - float(doc["time"]))
    except Exception:  # noqa: BLE001 - missing, unreadable: judged by the caller
        return None


class Attendance:
    """Whether someone drives the run, judged from the controller's heartbeat, at most every `every` s."""

    def __init__(self, store, run_prefix: str, after_s: float | None, started: float,
                 clock: Callable[[], float] = time.time):
        self.store, self.run_prefix, self.after_s = store, run_prefix, after_s
        self.started, self.clock = started, clock
        self._checked = -1e18
        self._unattended = False

    def unattended(self, force: bool = False) -> bool:
        if self.after_s is None or self.store is None:
            return False
        now = self.clock()
        if not force and now - self._checked < max(1.0, self.after_s / 4):
            return self._unattended
        self._checked = now
        age = controller_age(self.store, self.run_prefix, now)
        # No heartbeat at all: unattended once this host has waited as long for one.
        self._unattended = (now - self.started > self.after_s) if age is None else age > self.after_s
        return self._unattended


# -- ending the machine -----------------------------------------------------------------------------

def end_machine(se: SelfEnd) -> str:
    """End this host as its cloud allows; what was done, in a few words."""
    return clouds.for_provider(se.provider).end_machine(se)


# -- the terminal phase -----------------------------------------------------------------------------

def record(store, run_prefix: str, attempt: int, doc: dict, local_path=None) -> None:
    """Put `self_end` (and `unattended`) into this attempt's status.json (best effort)."""
    key = f"{run_prefix}/status.json"
    try:
        status = json.loads(store.get(key))
    except Exception:  # noqa: BLE001 - no status yet (a failed boot): a minimal one
        status = {"attempt": attempt}
    if status.get("attempt") not in (None, attempt):
        return  # a newer attempt owns status.json
    status.update(doc)
    data = json.dumps(status, sort_keys=True).encode()
    for _ in range(3):
        try:
            store.put(key, data)
            break
        except Exception as exc:  # noqa: BLE001
            log.warning("self-end: status upload failed: %s", exc)
            time.sleep(1)
    if local_path is not None:
        try:
            from .status import atomic_write

            atomic_write(local_path, data)
        except OSError:
            pass


def finish(se: SelfEnd, store, run_prefix: str, attempt: int, reason: str, *, attendance: Attendance | None = None,
           grace: bool = True, sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time,
           end: Callable[[SelfEnd], str] = end_machine, local_path=None) -> dict:
    """After the terminal phase: wait the grace (unless unattended or `grace` is False), record the
    end in status.json, end the machine. Returns the record."""
    t0 = clock()
    unattended = bool(attendance and attendance.unattended(force=True))
    if grace and not unattended and se.ends_machine:
        log.info("self-end: %s; waiting %.0fs for the controller before ending this host", reason, se.grace_s)
        while clock() - t0 < se.grace_s:
            sleep(min(1.0, max(0.0, se.grace_s - (clock() - t0))))
            if attendance is not None and attendance.unattended():
                unattended = True
                log.info("self-end: the controller's heartbeat is stale: ending now")
                break
    doc = {"reason": reason, "provider": se.provider, "at": clock(), "waited_s": round(clock() - t0, 2),
           "unattended": unattended}
    doc["action"] = clouds.for_provider(se.provider).END_ACTION
    if store is not None:
        record(store, run_prefix, attempt, {"self_end": doc, "unattended": unattended}, local_path)
    log.warning("self-end: %s (%s)", reason, doc["action"])
    try:
        doc["action"] = end(se)
    except Exception as exc:  # noqa: BLE001 - say so; the controller or gc ends it then
        log.error("self-end failed: %s", exc)
        doc["error"] = str(exc)
        if store is not None:
            record(store, run_prefix, attempt, {"self_end": doc}, local_path)
    return doc


class _LiteStore:
    """get/put over s3lite (standard library only) for a host whose boot failed before boto3."""

    def __init__(self, conf: dict, metadata: dict):
        from .s3lite import Bucket

        self.bucket = Bucket(conf, metadata)

    def get(self, key: str) -> bytes:
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            self.bucket.get(key, f"{d}/obj")
            with open(f"{d}/obj", "rb") as f:
                return f.read()

    def put(self, key: str, data: bytes) -> None:
        self.bucket.put_bytes(key, data)


REASONS = {0: "succeeded", 1: "failed", 3: "saved after a reclaim notice", 4: "lease lost"}


def main(argv: list[str] | None = None) -> int:
    """`python -m sdcloud_agent.selfend --config FILE --reason TEXT [--no-grace]`: the user-data's failed boot."""
    import argparse

    ap = argparse.ArgumentParser(prog="sdcloud_agent.selfend")
    ap.add_argument("--config", required=True)
    ap.add_argument("--reason", required=True)
    ap.add_argument("--no-grace", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with open(args.config, encoding="utf-8") as f:
        cfg = json.load(f)
    se = SelfEnd.from_dict(cfg.get("self_end"))
    store = None
    conf = cfg["store"] if isinstance(cfg["store"], dict) else {"url": cfg["store"]}
    try:
        from .store import open_store

        store = open_store(conf)
    except Exception:  # noqa: BLE001 - a failed boot has no boto3: the user-data's own S3 client
        try:
            store = _LiteStore(conf, cfg.get("metadata") or {})
        except Exception as exc:  # noqa: BLE001 - the host still ends
            log.warning("self-end: no store (%s)", exc)
    prefix = f"runs/{cfg['run_id']}"
    att = Attendance(store, prefix, se.unattended_after_s, time.time())
    finish(se, store, prefix, int(cfg.get("attempt", 1)), args.reason, attendance=att, grace=not args.no_grace)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
