"""A training run that moves to another cloud (`up --provider aws,tencent`): the checkpoint follows it.

When every zone of the current cloud refuses spot, and the run names another cloud, the controller
moves the run there instead of falling back to on-demand at home:

1. The newest complete checkpoint (and the run's inputs: its staged dataset, its cached model) is
   copied from the run's home store to the other cloud's store through presigned GETs the source
   signs (move_copy.py): by the destination's first host, which streams them into its own bucket
   with its own role (the controller leaves it a copy order of URLs, never bytes), or, where no host
   can, by the controller, streamed. No host ever holds the other cloud's keys.
2. Files first, the manifest last (bootstrap/sdcloud_agent/manifest.py owns what "complete" means):
   a copy cut halfway leaves no manifest in the destination, so no host restores it; the next try
   sends only what is missing (a PUT lands whole or not at all) and lands the manifest then.
3. The run keeps ONE home store for its journal, driver lease and stop requests; the host in the
   other cloud is told that cloud's store (its own role signs there) for its checkpoints, status and
   the controller's heartbeat, which the controller now reads and writes there.
4. The move is priced (offers/moves.py) and recorded: an event, and run-level ledger lines for the
   egress and the transfer time (costs/ledger.py, `cost report`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...costs import ledger as cost_ledger
from ...events import Kind
from ...offers.moves import MoveCost, move_cost
from ...providers import get_provider
from ...providers.loader import egress_price
from ...providers.traits import default_region, traits
from ..inputs.spec import RunPlan
from ..records.store import StoreError, open_run_store, store_config
# The copy itself (who carries the bytes, and how) is move_copy's; its names stay importable here.
from .move_copy import COPY_TRIES, SINGLE_PUT_BYTES, URL_SECONDS, Copied, copy_checkpoint, copy_object  # noqa: F401
from . import move_copy

MOVE_MARGIN = 0.10  # the other cloud must be this much cheaper to finish, the move included
MAX_MOVE_FAILURES = 3  # moves whose copy never landed, after which the run falls back as in one cloud


def other_cloud(ctl: Any) -> str | None:
    """The next cloud of the run's list after the current one (None: the run names one cloud)."""
    names = ctl.spec.providers or []
    if len(names) < 2 or ctl.cloud not in names:
        return None
    return names[(names.index(ctl.cloud) + 1) % len(names)]


def _dst_infra(state: Any, name: str) -> dict:
    return state.infra(name, "") or state.infra(name, default_region(name) or "") or {}


def store_conf_for(ctl: Any, name: str) -> dict:
    """The store a host in cloud `name` is told: the run's home store at home, else that cloud's bucket."""
    if name == ctl.home_cloud:
        return ctl.home_store_conf
    infra = _dst_infra(ctl.state, name)
    return store_config(name, None, infra.get("region") or default_region(name), infra)


def bind(ctl: Any, name: str) -> None:
    """Point the controller's launches, host status and fleet at cloud `name` (no copy: see move)."""
    from ...fleet.lifecycle import Fleet
    from ...spot.policy import get_policy

    given = getattr(ctl, "cloud_providers", {}) or {}
    ctl.cloud = name
    ctl.provider = given.get(name) or get_provider(name)
    home = name == ctl.home_cloud
    infra = ctl.home_infra if home else _dst_infra(ctl.state, name)
    # Away from home: the region of that cloud's stack, else its default (the catalog's first choice).
    spec = replace(ctl.spec, provider=name, region=ctl.home_region if home else (infra.get("region") or default_region(name)),
                   store=ctl.home_spec_store if home else None)
    ctl.plan = RunPlan(spec, ctl.tier, traits(name))
    ctl.spec = spec
    ctl._infra = infra
    ctl.store_conf = store_conf_for(ctl, name)
    ctl.store = ctl.home_store if home else open_run_store(ctl.store_conf)
    if ctl._inputs is not None:
        ctl._inputs = dict(ctl._inputs, dataset=_dataset_in(ctl, ctl._inputs.get("dataset")))
    offers = _candidates(ctl, name, ctl.provider, spec)
    ctl.fleet = Fleet(ctl.run_id, ctl.provider, name, ctl.state, offers, get_policy("sdcloud"), ctl.event,
                      ctl.timing, spec_market=spec.market, max_price=ctl.plan.max_price)


def _candidates(ctl: Any, name: str, provider: Any, spec: Any) -> list:
    from ...fleet.candidates import candidates as fleet_candidates
    from ..inputs.training import gpus_used
    from . import lessons

    return fleet_candidates(provider, ctl.tier, spec.market, name=name, max_price=ctl.plan.max_price,
                            region=spec.region, job_size=ctl.total_steps, events=ctl.event, gpus_used=gpus_used(spec),
                            book=lessons.run_book(ctl))


def _dataset_in(ctl: Any, dataset: str | None) -> str | None:
    """The staged dataset's URL in the current cloud's store (its key under the run is the same)."""
    home = str(ctl.home_store_conf.get("url", "")).rstrip("/")
    if dataset and home and dataset.startswith(home + "/"):
        return str(ctl.store_conf["url"]).rstrip("/") + dataset[len(home):]
    return dataset


def remember_home(ctl: Any) -> None:
    """At the controller's start: the home cloud and store, and the cloud of its newest attempt (a
    controller started again after a move carries on in the cloud the run moved to)."""
    ctl.home_cloud = ctl.cloud = ctl.spec.provider
    ctl.home_store, ctl.home_store_conf, ctl.home_infra = ctl.store, ctl.store_conf, ctl._infra
    ctl.home_region, ctl.home_spec_store = ctl.spec.region, ctl.spec.store
    last = next(reversed(ctl.state.attempts(ctl.run_id)), None)
    if last is not None and ctl.spec.providers and last.provider != ctl.cloud and last.provider in ctl.spec.providers:
        bind(ctl, last.provider)


def move(ctl: Any, dst: str, why: str) -> bool:
    """Carry the run to cloud `dst`: copy, price, record, then bind. False when the copy did not land
    (the run stays where it is; the next step tries again, sending only what is missing)."""
    src_store = ctl.store
    dst_conf = store_conf_for(ctl, dst)
    dst_store = ctl.home_store if dst == ctl.home_cloud else open_run_store(dst_conf)
    inputs = ctl.ensure_inputs()
    copied, error = _carry(ctl, src_store, dst_store, inputs)
    if copied is None:
        ctl.event(Kind.CLOUD_MOVE_FAILED, {"from": ctl.cloud, "to": dst, "error": error})
        return False
    cost: MoveCost = move_cost(ctl.cloud, dst, copied.sent, egress=egress_price(ctl.cloud, ctl.spec.region))
    ctl.event(Kind.CLOUD_MOVED, {"from": ctl.cloud, "to": dst, "why": why, "step": copied.step,
                                 "bytes": copied.sent, "skipped": copied.skipped, "seconds": copied.seconds,
                                 "egress_usd": cost.egress_usd, "transfer_hours": round(cost.transfer_hours, 6),
                                 "reason": cost.reason})
    if not copied.by_host:  # a host's copy is recorded from its report, as it paid it (settle_host_copy)
        cost_ledger.record_move(ctl.state, ctl.run_id, ctl.cloud, copied.fetched or copied.sent, copied.seconds,
                                region=ctl.spec.region)
    bind(ctl, dst)
    return True


# -- the copy's carrier (move_copy.py): the destination's host where it can, else this controller --
def _carry(ctl: Any, src_store: Any, dst_store: Any, inputs: dict | None) -> tuple[Copied | None, str | None]:
    """The copy ordered from the destination's host, or made here; (None, error) when it did not land.
    A copy made here that was cut has its egress recorded: the source bills every byte read."""
    from ...offers.moves import move_rate_mb_s

    if move_copy.host_can_copy(src_store, dst_store):
        try:
            return move_copy.order_copy(src_store, dst_store, ctl.run_id, ctl.cloud, inputs, move_rate_mb_s()[0],
                                        region=ctl.spec.region), None
        except StoreError as exc:
            return None, str(exc)
    error = None
    for _ in range(COPY_TRIES):
        tally = move_copy.host_copy.Fetched()
        try:
            return copy_checkpoint(src_store, dst_store, ctl.run_id, inputs, tally), None
        except StoreError as exc:
            error = str(exc)
            if tally.fetched and ctl.state is not None:
                cost_ledger.record_move(ctl.state, ctl.run_id, ctl.cloud, tally.fetched, 0.0, region=ctl.spec.region)
    return None, error


def settle_host_copy(ctl: Any) -> None:
    """The egress of a copy the destination's host carried out or failed (its report), in the ledger."""
    try:
        report = move_copy.settle(ctl.store, ctl.run_id)
    except StoreError:  # read again at the next attempt or the run's end
        return
    if report is None:
        return
    source = str(report.get("from") or ctl.home_cloud)
    if int(report.get("fetched") or 0) > 0:
        cost_ledger.record_move(ctl.state, ctl.run_id, source, int(report["fetched"]), float(report.get("seconds") or 0.0),
                                region=report.get("region"))
    if report.get("state") == "failed" and source != ctl.cloud:  # the next host gets fresh URLs, same files
        from ...offers.moves import move_rate_mb_s

        src = ctl.home_store if source == ctl.home_cloud else open_run_store(store_conf_for(ctl, source))
        try:
            move_copy.refresh_order(src, ctl.store, ctl.run_id, move_rate_mb_s()[0])
        except StoreError:  # the next failed report tries again
            pass


def after_spot_refused(ctl: Any) -> bool:
    """Every zone of the current cloud refused spot: move to the run's other cloud rather than go
    on-demand here. True: this step is done (moved, or the copy was cut and is tried again next time,
    at most MAX_MOVE_FAILURES times). Spot refused in the other cloud too falls back as one cloud does."""
    from ...spot.policy import SPOT, spot_gone_after

    dst = other_cloud(ctl)
    if dst is None or ctl.spec.market != SPOT:
        return False
    if not spot_gone_after(ctl.fleet.failed_launches(SPOT), True):
        return False
    if dst in getattr(ctl, "clouds_refused", set()) or getattr(ctl, "move_failures", 0) >= MAX_MOVE_FAILURES:
        return False
    here = ctl.cloud
    if move(ctl, dst, f"every {here} zone refused spot"):
        ctl.clouds_refused = getattr(ctl, "clouds_refused", set()) | {here}
        return True
    # The copy was cut: this step launches nothing; the next refusal here tries the copy again.
    ctl.move_failures = getattr(ctl, "move_failures", 0) + 1
    return True


def finish_usd(ctl: Any, offers: list, steps_left: int) -> float | None:
    """The cheapest expected cost (USD) to finish `steps_left` on one of `offers` (spot: with its
    reclaim overhead), as `offers` ranks them (offers/optimizer.py); None without a priced one."""
    from ...offers.optimizer import estimate
    from . import lessons

    book = lessons.run_book(ctl)
    costs = [e.est_cost for e in (estimate(ctl.tier, o, job_size=steps_left, book=book) for o in offers) if e]
    return min(costs) if costs else None


def worth_moving(here_usd: float | None, there_usd: float | None, move: MoveCost) -> bool:
    """Whether finishing in the other cloud, the move's egress included, beats finishing here by
    MOVE_MARGIN: a move is a restart with more at stake (a copy, a cold cache), so a near tie stays."""
    if there_usd is None:
        return False
    if here_usd is None:
        return True
    return there_usd + move.egress_usd < here_usd * (1.0 - MOVE_MARGIN)


def cheaper_elsewhere(ctl: Any) -> bool:
    """Before a spot run's next attempt (after a reclaim or a failure): move when the other cloud is
    cheaper to finish, the move priced in (offers/moves.py). Weighed once per attempt."""
    from ...spot.policy import SPOT

    dst = other_cloud(ctl)
    if dst is None or dst in getattr(ctl, "clouds_refused", set()):  # no way back to a cloud whose spot ran dry
        return False
    attempts = ctl.state.attempts(ctl.run_id)
    if ctl.spec.market != SPOT or not attempts or getattr(ctl, "weighed_at", None) == len(attempts):
        return False
    ctl.weighed_at = len(attempts)
    steps_left = max(1, ctl.total_steps - int(ctl.row.get().get("step") or 0))
    provider = (getattr(ctl, "cloud_providers", {}) or {}).get(dst) or get_provider(dst)
    region = _dst_infra(ctl.state, dst).get("region") or default_region(dst)
    there = finish_usd(ctl, _candidates(ctl, dst, provider, replace(ctl.spec, provider=dst, region=region)), steps_left)
    here = finish_usd(ctl, [o for o in ctl.fleet.candidates if o.market == SPOT], steps_left)
    # Every byte the move carries: the checkpoint, the staged dataset and the cached model (move_copy.py).
    cost = move_cost(ctl.cloud, dst, move_copy.carried_bytes(ctl.store, ctl.run_id, ctl.ensure_inputs()),
                     egress=egress_price(ctl.cloud, ctl.spec.region))
    if not worth_moving(here, there, cost):
        return False
    why = f"{dst} is cheaper to finish: ${there:.2f} + ${cost.egress_usd:.4f} egress against ${here or 0:.2f}"
    ctl.cloud_providers = {**(getattr(ctl, "cloud_providers", {}) or {}), dst: provider}  # made once, kept
    return move(ctl, dst, why)


__all__ = ["Copied", "settle_host_copy", "finish_usd", "worth_moving", "cheaper_elsewhere", "copy_checkpoint", "copy_object",
           "other_cloud", "bind", "move", "remember_home", "after_spot_refused", "store_conf_for"]
