"""A run's checkpoint carried to another cloud's store (`up --provider aws,tencent`): who copies.

The spot policy decides a move and the controller makes it (runs/driving/placement.py); this module
says who carries the bytes, and records what the carrier paid:

1. The newest complete checkpoint (and the run's inputs: its staged dataset, its cached model) is
   copied from the store holding it to the other cloud's store through presigned GETs the source
   signs (move_copy.py): by the destination's first host, which streams them into its own bucket
   with its own role (the controller leaves it a copy order of URLs, never bytes), or, where no host
   can, by the controller, streamed. No host ever holds the other cloud's keys.
2. Files first, the manifest last (bootstrap/sdcloud_agent/manifest.py owns what "complete" means):
   a copy cut halfway leaves no manifest in the destination, so no host restores it; the next try
   sends only what is missing (a PUT lands whole or not at all) and lands the manifest then.
3. A host's copy is paid as its report says (settle_host_copy): the bytes it fetched, failed tries
   included, are egress of the source's region in the ledger.
"""

from __future__ import annotations

from typing import Any, Callable

from ...costs import ledger as cost_ledger
from ..records.state import StateStore
from ..records.store import StoreError
# The copy itself (who carries the bytes, and how) is move_copy's; its names stay importable here.
from .move_copy import COPY_TRIES, SINGLE_PUT_BYTES, URL_SECONDS, Copied, copy_checkpoint, copy_object  # noqa: F401
from . import move_copy


def carry_copy(state: StateStore | None, run_id: str, src_cloud: str, src_region: str | None, src_store: Any,
               dst_store: Any, inputs: dict | None) -> tuple[Copied | None, str | None]:
    """The copy ordered from the destination's host, or made here; (None, error) when it did not land.
    A copy made here that was cut has its egress recorded: the source bills every byte read."""
    from ...offers.moves import move_rate_mb_s

    if move_copy.host_can_copy(src_store, dst_store):
        try:
            return move_copy.order_copy(src_store, dst_store, run_id, src_cloud, inputs, move_rate_mb_s()[0],
                                        region=src_region), None
        except StoreError as exc:
            return None, str(exc)
    error = None
    for _ in range(COPY_TRIES):
        tally = move_copy.host_copy.Fetched()
        try:
            return copy_checkpoint(src_store, dst_store, run_id, inputs, tally), None
        except StoreError as exc:
            error = str(exc)
            if tally.fetched and state is not None:
                cost_ledger.record_move(state, run_id, src_cloud, tally.fetched, 0.0, region=src_region)
    return None, error


def settle_host_copy(state: StateStore, run_id: str, store: Any, here: str, home: str,
                     store_of: Callable[[str], Any]) -> None:
    """The egress of a copy the destination's host carried out or failed (its report in `store`, the
    run's store in cloud `here`), in the ledger; a failed one's order signed afresh for the next host."""
    try:
        report = move_copy.settle(store, run_id)
    except StoreError:  # read again at the next attempt or the run's end
        return
    if report is None:
        return
    source = str(report.get("from") or home)
    if int(report.get("fetched") or 0) > 0:
        cost_ledger.record_move(state, run_id, source, int(report["fetched"]), float(report.get("seconds") or 0.0),
                                region=report.get("region"))
    if report.get("state") == "failed" and source != here:  # the next host gets fresh URLs, same files
        from ...offers.moves import move_rate_mb_s

        try:
            move_copy.refresh_order(store_of(source), store, run_id, move_rate_mb_s()[0])
        except StoreError:  # the next failed report tries again
            pass


__all__ = ["COPY_TRIES", "Copied", "carry_copy", "copy_checkpoint", "copy_object", "settle_host_copy"]
