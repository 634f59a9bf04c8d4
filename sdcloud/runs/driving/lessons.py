"""What a training run teaches the optimizer (sdcloud/speeds): the rates this machine recorded and
observed, as the run's trainer sees them, and each ended attempt's own figures kept."""

from __future__ import annotations

from typing import Any, Protocol

from ...offers.optimizer import Offer
from ...offers.tiers import Tier
from ..records.run_spec import RunSpec
from ..records.state import Attempt, StateStore
from .owner import Memo

from ..records.books import user_book  # noqa: F401 - offers, batch and up import it from here


class LessonsOwner(Protocol):
    """What the run's lessons read of its controller."""

    spec: RunSpec
    tier: Tier
    state: StateStore
    run_id: str
    store: Any
    memo: Memo

    @property
    def candidates(self) -> list[Offer]: ...

    def attempts(self) -> list[Attempt]: ...


def learn_attempt(ctl: LessonsOwner, cur: Attempt) -> None:
    """Keep what the ended attempt `cur` of the controller's run measured: its steady rate, start-up
    and reclaim, keyed by its host's GPU, the tier, the trainer and the model (recipe '' for the tier's own)."""
    from ...speeds.observe import learn
    from ..inputs.training import gpus_used, resolve_model

    try:
        ended = next((a for a in ctl.attempts() if a.n == cur.n), cur)
        row = next((o.row for o in ctl.candidates if o.row.instance_type == cur.instance_type), None)
        used = gpus_used(ctl.spec)
        count = row.gpu_count if row is not None and used is None else (used or 1)
        model = resolve_model(ctl.spec.model, ctl.spec.provider, ctl.tier)
        recipe = "" if model == ctl.tier.base_model else model
        learn(ctl.state, ctl.run_id, ended, tier=ctl.tier.name, gpu=row.gpu if row is not None else "",
              gpu_count=count, trainer=ctl.spec.trainer, recipe=recipe, store=ctl.store)
    except Exception:  # noqa: BLE001 - a figure not kept never stops a run (the ledger keeps the raw figures)
        pass


def run_book(ctl: LessonsOwner):
    """The controller's rate book, read once from its state store for its trainer (kept in its Memo)."""
    if ctl.memo.rate_book is None:
        from ...speeds.book import load_book

        ctl.memo.rate_book = load_book(ctl.state, ctl.spec.trainer)
    return ctl.memo.rate_book


def replan(state, run_id: str, planned, step: int, total_steps: int):
    """`planned` (a fleet Progress on the book's or catalog's rate) with the work left at the newest warm
    attempt's measured rate (speeds/replan.py); as planned before any attempt is warm."""
    from ...speeds.replan import measured_rate, replanned

    measured = measured_rate(state, run_id)
    return replanned(planned, measured[1] if measured else None, step, total_steps)
