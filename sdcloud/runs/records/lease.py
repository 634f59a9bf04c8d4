"""Who drives a run: a lease in the run's bucket that exactly one driver holds at a time.

A driver is anything that takes controller steps: `sdcloud up` in the foreground, its `--detach`
daemon, or one invocation of the scheduled function in the user's account (sdcloud.driver.unattended).
Each step renews the lease; a driver whose renewal fails has lost the run and stops acting before
its next step, and a driver confirms it still holds the lease right before it launches or ends a
host (`guard`). The lease is the batch items' lease (sdcloud_agent.batch.lease) on the object
`runs/<id>/leases/driver.json`: create-only to claim, compare-and-swap to renew and hand over, and
on COS (no compare-and-swap) one create-only object per lease term, the terms before the current
one deleted by the driver that takes the next (`driver.json` itself, the first term's, is kept: a
claim starts by creating it). Its time to live is several polls, so a laptop that goes away passes
its runs on within minutes (`LEASE_POLLS`).

Every driver holds the lease under its own name: a machine's `host:pid`, and an invocation of the
cloud function its function's name and the platform's request id (`aws-lambda:<id>`), never the
function's name alone, so that two invocations racing after a reclaim are two drivers and one wins.
An invocation that ends with the run still live *parks* the lease: it stays live for others (a
laptop that wakes up does not race the function), but the function's next invocation continues
at once. The lease body says who holds it (`kind`: machine, daemon or function), which `holder`
reads for `status` and `watch`.

One refinement for the common restart: a lease held by a process of this same machine that no
longer exists (a controller killed with -9, a reboot) is expired at once, so `sdcloud resume` right
after a crash does not wait for the lease to lapse.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable

from sdcloud_agent.batch.lease import Lease, Leases

from ...errors import UserError

LEASE_ITEM = "driver"
# The lease outlives this many polls without a renewal (and at least a minute).
LEASE_POLLS = 6
MIN_LEASE_SECONDS = 60.0
MACHINE, DAEMON, FUNCTION = "machine", "daemon", "function"


def this_driver() -> str:
    """The name this process drives under: machine and pid (a laptop, a daemon), or the function's."""
    fn = os.environ.get("SDCLOUD_DRIVER")
    if fn:
        return fn
    return f"{socket.gethostname()}:{os.getpid()}"


def invocation_id(function: str, request_id: str | None = None) -> str:
    """One invocation's name in a lease: its function's name and the platform's request id (a fresh
    random id when the platform gives none)."""
    return f"{function}:{request_id or uuid.uuid4().hex}"


def _functions() -> set[str]:
    from ...providers.traits import every

    return {t.function.name for t in every() if t.function is not None}


def function_of(worker: str) -> str | None:
    """The cloud function a lease holder's name belongs to (`aws-lambda:<id>`, or an older lease's
    bare `aws-lambda`), or None for a machine."""
    name = worker.split(":", 1)[0]
    return name if name in _functions() else None


def _identity(worker: str) -> dict:
    """What the lease body says of its holder, beside its name."""
    fn = function_of(worker)
    if fn is not None:
        return {"kind": FUNCTION, "function": fn, "invocation": worker.split(":", 1)[1] if ":" in worker else None}
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    daemon = spec is not None and spec.name == "sdcloud.runs.driving.controller"  # `sdcloud up --detach`'s process
    host, _, pid = worker.rpartition(":")
    return {"kind": DAEMON if daemon else MACHINE, "host": host or worker, "pid": int(pid) if pid.isdigit() else None}


def _dead_here(worker: str) -> bool:
    """A lease holder that was a process of this machine which is gone (or a zombie)."""
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


class _DriverLeases(Leases):
    take_over = False  # the user asked this driver to take the run (sdcloud watch RUN --drive)
    parked = False  # the next write says: this invocation is done, its function's next one continues

    def __init__(self, store: Any, job: str, worker: str, ttl: float, clock: Callable[[], float]):
        super().__init__(store, job, worker, ttl=ttl, clock=clock)
        self.identity = _identity(worker)
        self.function = self.identity.get("function")
        self.seen: dict | None = None  # the lease body the last claim found (who had the run before)

    def live(self, held: dict, now: float) -> bool:
        self.seen = held
        if self.take_over or not super().live(held, now):
            return False
        worker = str(held.get("worker", ""))
        if worker == self.worker:
            return False  # this very driver's own lease (a controller made again in one process)
        if held.get("parked") and self.function is not None and function_of(worker) == self.function:
            return False  # its function's previous invocation is done: the next continues
        return not _dead_here(worker)

    def _body(self, item: str, token: str, attempt: int, expires_at: float, released: bool = False) -> bytes:
        body = json.loads(super()._body(item, token, attempt, expires_at, released))
        body.update(self.identity)
        if self.parked and not released:
            body["parked"] = True
        return json.dumps(body).encode()

    def claim(self, item: str) -> Lease | None:
        self.seen = None
        lease = super().claim(item)
        if lease is None or self.cas or lease.attempt <= 1:
            return lease
        # One object per term (COS): the terms before this one are deleted, and a term that appeared
        # after this one between the listing and the create means this claim came too late.
        if not self._prune(item, lease.attempt):
            return None
        return lease

    def _terms(self, item: str) -> dict[int, str]:
        base = self._key(item, 1)
        out = {}
        for o in self.store.list(base):
            tail = o.key.removeprefix(base)
            if tail == "":
                out[1] = o.key
            elif tail.startswith(".") and tail[1:].isdigit():
                out[int(tail[1:])] = o.key
        return out

    def _prune(self, item: str, mine: int) -> bool:
        from .store import StoreError

        terms = self._terms(item)
        if max(terms, default=mine) > mine:
            return False
        for n, key in terms.items():
            if 1 < n < mine:
                try:
                    self.store.delete(key)
                except (StoreError, OSError):
                    pass  # the next taker deletes it
        return True

    def _rewrite_own(self, lease: Lease, body: bytes) -> bool:
        """Without compare-and-swap: rewrite this term's object unless a later term exists. The terms
        are listed (not the next one looked up), because the ones before the newest are deleted."""
        if max(self._terms(lease.item), default=lease.attempt) != lease.attempt:
            return False
        self.store.put(self._key(lease.item, lease.attempt), body)
        return True


class LeaseLost(Exception):
    """This driver does not hold the run's lease any more: it acts no more on the run."""


class DriverLease:
    """The run's driver lease as this process holds it (or not)."""

    def __init__(self, store: Any, run_id: str, poll_seconds: float, driver: str | None = None,
                 clock: Callable[[], float] | None = None):
        self.run_id = run_id
        self.driver = driver or this_driver()
        self.ttl = max(MIN_LEASE_SECONDS, LEASE_POLLS * poll_seconds)
        # time.time looked up at each call, so that a test's clock applies to leases made before it was set
        self._leases = _DriverLeases(store, f"runs/{run_id}", self.driver, ttl=self.ttl,
                                     clock=clock or (lambda: time.time()))
        self._held: Lease | None = None
        self.lost = False  # it held the lease and a renewal found another driver's (journal.Journal reads it)

    @property
    def held(self) -> bool:
        return self._held is not None

    @property
    def previous(self) -> dict | None:
        """The lease body the last claim found: who held the run before this driver took it."""
        return self._leases.seen

    def holder(self) -> dict | None:
        return self._leases.holder(LEASE_ITEM)

    def acquire(self, take_over: bool = False) -> bool:
        """Take the run if no other driver holds a live lease on it; with `take_over`, even if one
        does (an explicit ask of the user's: the other driver's next renewal fails and it stops)."""
        if self._held is None:
            self._leases.take_over = take_over
            try:
                self._held = self._leases.claim(LEASE_ITEM)
            finally:
                self._leases.take_over = False
            if self._held is not None:
                self.lost = False
        return self._held is not None

    def acquire_or_refuse(self, take_over: bool = False) -> None:
        if not self.acquire(take_over):
            held = self.holder() or {}
            who = describe(Holder.of(held, time.time())) if held else "another driver"
            left = max(0, int(float(held.get("expires_at", 0)) - time.time()))
            raise UserError(f"run {self.run_id} is driven by {who} "
                            f"(its lease runs {left} s more); follow it with: sdcloud watch {self.run_id}, "
                            f"or drive it from here with: sdcloud watch {self.run_id} --drive")

    def renew(self) -> bool:
        """Before each step: False when another driver has taken the run (then act no more)."""
        if self._held is None:
            return False
        if not self._leases.renew(self._held):
            self._held = None
            self.lost = True
            return False
        return True

    def confirm(self) -> None:
        """Right before an action (a launch, a terminate): renewed, or LeaseLost."""
        if not self.renew():
            raise LeaseLost(f"run {self.run_id}: {self.driver} no longer holds its lease")

    def park(self, until_next: float = 0.0) -> bool:
        """An invocation that is done with a live run: the lease stays live for every other driver
        until the function's next invocation is due (`until_next` seconds) and a term more, and that
        invocation continues at once (without waiting for it to lapse)."""
        if self._held is None:
            return False
        self._leases.parked, ttl = True, self._leases.ttl
        self._leases.ttl = ttl + max(0.0, until_next)
        try:
            return self.renew()
        finally:
            self._leases.parked, self._leases.ttl = False, ttl
            self._held = None

    def release(self) -> None:
        """Hand the run over at once (the run ended, or this driver stops driving it)."""
        if self._held is not None:
            self._leases.release(self._held)
            self._held = None


class Guarded:
    """A provider whose launches and terminations first confirm that this driver still holds the run's
    lease (DriverLease.confirm): a driver that lost the run between its step's renewal and the
    action raises LeaseLost instead of acting on a view that is no longer the run's."""

    def __init__(self, inner: Any, lease: DriverLease):
        self.inner, self.lease = inner, lease

    def launch(self, *args: Any, **kwargs: Any) -> Any:
        self.lease.confirm()
        return self.inner.launch(*args, **kwargs)

    def terminate(self, *args: Any, **kwargs: Any) -> Any:
        self.lease.confirm()
        return self.inner.terminate(*args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


@dataclass(frozen=True)
class Holder:
    """Who drives a run, as its lease in the bucket says (`status`, `watch`)."""

    worker: str
    kind: str  # machine, daemon or function
    live: bool  # the lease keeps other drivers out now
    expires_in: float  # seconds (negative: lapsed that long ago; 0 for a lease handed back)
    parked: bool = False  # a function's invocation is done; its next one continues
    released: bool = False  # handed back by its holder (its expiry is written as 0: no age to tell)
    host: str | None = None
    pid: int | None = None
    function: str | None = None
    invocation: str | None = None

    @classmethod
    def of(cls, body: dict, now: float) -> "Holder":
        worker = str(body.get("worker") or "")
        ident = {**_identity(worker), **{k: body[k] for k in ("kind", "host", "pid", "function", "invocation")
                                         if body.get(k) is not None}}
        if "kind" not in body and ident["kind"] == DAEMON:
            ident["kind"] = MACHINE  # a lease written before it said: not known to be a daemon
        expires = float(body.get("expires_at") or 0.0)
        released = bool(body.get("released"))
        live = not released and expires > now and not _dead_here(worker)
        # A handed-back lease says expires_at 0: its "age" counted from 0 was the whole epoch (57 years).
        left = 0.0 if released or not expires else round(expires - now, 1)
        return cls(worker=worker, kind=str(ident["kind"]), live=live, expires_in=left,
                   parked=bool(body.get("parked")), released=released, host=ident.get("host"), pid=ident.get("pid"),
                   function=ident.get("function"), invocation=ident.get("invocation"))

    def as_dict(self) -> dict:
        return {**asdict(self), "says": describe(self)}


def describe(h: Holder) -> str:
    """The holder in words: "the cloud function aws-lambda (invocation 1f2e...)", "this machine's ..." """
    if h.kind == FUNCTION:
        who = f"the cloud function {h.function}" + (f" (invocation {h.invocation})" if h.invocation else "")
    elif h.kind == DAEMON:
        who = f"a background controller on {h.host} (pid {h.pid})"
    else:
        who = f"sdcloud on {h.host}" + (f" (pid {h.pid})" if h.pid is not None else "")
    return who


def holder(store: Any, run_id: str, now: float | None = None) -> Holder | None:
    """Who holds the run's driver lease, from its bucket (one or two reads); None when no driver ever
    took it. A holder whose lease lapsed is returned with `live` False: nobody drives the run."""
    body = _DriverLeases(store, f"runs/{run_id}", "observer", ttl=0.0, clock=time.time).holder(LEASE_ITEM)
    return Holder.of(body, time.time() if now is None else now) if body else None


def driving_line(h: Holder | None, run_id: str) -> str | None:
    """One line for `status` and `watch`: who drives the run, or that nobody does since when."""
    if h is None:
        return None
    if h.live and h.parked:
        return (f"driven by {describe(h)}: between invocations, the next one continues it "
                f"(its lease runs {max(0, int(h.expires_in))} s more)")
    if h.live:
        return f"driven by {describe(h)} (its lease runs {max(0, int(h.expires_in))} s more)"
    if h.released or h.expires_in > 0:  # handed back, or a holder that is gone before its lease's end
        return f"nobody drives run {run_id}: {describe(h)} handed it back"
    return f"nobody drives run {run_id}: the lease of {describe(h)} lapsed {max(0, int(-h.expires_in))} s ago"
