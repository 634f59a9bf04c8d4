"""A provider's optional powers, each a protocol checked with isinstance.

`base.Provider` is what every provider does (offers, launch, describe, terminate, find_tagged,
price_history). What only some can do is one protocol here; callers ask
`isinstance(provider, HasZones)` instead of probing attributes by name, so a typo is an import
error rather than a silently skipped feature, and `tests/providers/test_provider_capabilities.py` lists what
each provider can do.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from .base import EventSink, Instance


@runtime_checkable
class HasZones(Protocol):
    """Lists a region's zones, so that the optimizer's offers split into one candidate per zone."""

    def zones(self, region: str) -> list[str]: ...


@runtime_checkable
class LaunchesGroups(Protocol):
    """Launches a multi-node group (`up --nodes N`, N > 1) as one instance (providers/groups.py).

    Asked of the provider's class before anything is made (providers/groups.check_group): a
    staticmethod. `group_limit()` is the most hosts one group may have here and what bounds it, in
    words ("2 CPU cores"), or None where only `--nodes`' own limit applies (a cloud's quota answers
    at launch). A provider without this power runs one host per run (the user's own boxes)."""

    def group_limit(self) -> tuple[int, str] | None: ...


@runtime_checkable
class ChecksCredentials(Protocol):
    """Can tell before anything is created whether the user's credentials work (one line, exit 2)."""

    def check_credentials(self) -> None: ...


@runtime_checkable
class RenewsHostCredentials(Protocol):
    """Hands a long-running host fresh, short-lived store credentials (own boxes have no role)."""

    def renew_credentials(self, instance_id: str, run_id: str, store_conf: dict, events: EventSink = ...) -> bool: ...


@runtime_checkable
class HasShell(Protocol):
    """`sdcloud ssh RUN`: the argv that opens a shell on the run's host."""

    def ssh_argv(self, instance: Instance | str) -> list[str]: ...


@runtime_checkable
class Closable(Protocol):
    """Holds connections or servers that the command must close when it ends."""

    def close(self) -> None: ...


@runtime_checkable
class SimulatesReclaim(Protocol):
    """Can announce a reclaim on its own host (`--simulate-preemption`)."""

    def schedule_reclaim(self, instance_id: str, after_seconds: float, events: EventSink = ...) -> None: ...


@runtime_checkable
class HasHostDir(Protocol):
    """Its hosts' working directories are readable here (this machine), e.g. the boot log."""

    def host_dir(self, instance_id: str) -> str | None: ...


@runtime_checkable
class ReportsSearchErrors(Protocol):
    """A search across regions (find_tagged) that kept going past a region's error says which failed."""

    last_errors: list


@dataclass(frozen=True)
class Bill:
    """What the cloud's bill says one run cost: the amount in the bill's currency, and where it was read."""
    amount: float
    currency: str
    source: str  # "aws-cost-explorer", "tencent-describe-bill-detail"


@runtime_checkable
class ReconcilesBill(Protocol):
    """Reads what the cloud's bill says each run cost (`sdcloud cost reconcile`).

    A provider's billing module (`traits(name).bill`) satisfies it: the bill is the account's, not
    a provider instance's, and reading it needs no compute client. `runs` are the state store's run
    rows of this provider; `state` gives their attempts (instance ids, times, currencies); `client`
    replaces the SDK's client (tests). A run the bill does not show yet is left out.
    """

    def billed(self, state: Any, runs: list[dict], now: float, client: Any = None) -> dict[str, Bill]: ...


@runtime_checkable
class HasPriceHistory(Protocol):
    """Answers the past spot prices of a zone (`traits(name).spot_prices == "history"` says whether
    the cloud publishes them; a stand-in provider of a test may not answer at all)."""

    def price_history(self, instance_type: str, zone: str, start: datetime, end: datetime) -> list[tuple[datetime, float]]: ...


@runtime_checkable
class SchedulesBatch(Protocol):
    """Puts a batch schedule on the cloud's own scheduler, which invokes the stack's cloud driver
    with `payload` at each cron time (batch/cloud_schedules.py).

    A provider's schedules module (`traits(name).schedules`) satisfies it: a schedule belongs to the
    account's stack, not to a provider instance. `expression` turns a five-field cron in zone `tz`
    into the cloud's own form, or raises UserError (one line) for what the cloud cannot express;
    `infra` is the stack's outputs; `client` replaces the SDK's client (tests).
    """

    KIND: str  # what the cloud calls the thing made ("EventBridge Scheduler schedule", "SCF timer trigger")
    DEFAULT_TZ: str  # the zone of a schedule given no --tz
    ZONE_NOTE: str | None  # said at `schedule add` where the zone the cloud's cron runs in is assumed

    def expression(self, cron: str, tz: str) -> str: ...

    def create(self, name: str, expression: str, tz: str, payload: dict, infra: dict, client: Any = None) -> None: ...

    def delete(self, name: str, infra: dict, client: Any = None) -> bool: ...

    def listed(self, infra: dict, client: Any = None) -> list[dict]: ...

    # The schedule's state before (ENABLED or DISABLED), None where the cloud has no such schedule.
    def set_enabled(self, name: str, enabled: bool, infra: dict, client: Any = None) -> str | None: ...


@runtime_checkable
class ChangesBid(Protocol):
    """A market whose interruptible price is a bid on one machine (Vast.ai): an outbid host pauses, and
    a higher bid wins it back (fleet/pauses.py, spot/pause.py)."""

    def change_bid(self, instance_id: str, price: float) -> None: ...

    def min_bid(self, instance_id: str) -> float | None: ...
