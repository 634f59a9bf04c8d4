"""What moving a run between clouds cost, as its own lines of the run's ledger (n = 0, run-level):

- `move egress <src>`: the bytes read out of the source cloud's store (by the destination's host or
  the controller; a failed copy's too), at that cloud's internet egress list price in its region and
  the account's currency (costs/billing_rules.py's egress_charge, the provider's egress trait);
- `move transfer`: the copy's time, measured, in which no GPU host ran: no money of its own, but the
  hours a deadline loses to the move (offers/moves.py plans them; the report shows both).

Run-level items share n = 0 with the artifacts' egress (ledger.record_egress), so each write keeps
the others (`put_run_items`).
"""

from __future__ import annotations

from .. import config
from .billing_rules import egress_charge


def put_run_items(state, run_id: str, items: list[dict]) -> None:
    """Replace the run-level items named in `items`, keeping every other run-level item."""
    names = {i["item"] for i in items}
    kept = [i for i in state.ledger(run_id) if i["n"] == 0 and i["item"] not in names]
    state.put_ledger(run_id, 0, kept + items)


def record_move(state, run_id: str, src: str, nbytes: int, seconds: float, region: str | None = None) -> None:
    """One copy's bytes out of cloud `src` (its `region`) and its seconds, added to the run's move
    lines; a copy that failed is recorded too, with the bytes it read: the source bills them."""
    before = {i["item"]: i for i in state.ledger(run_id) if i["n"] == 0}
    name = f"move egress {src}"
    total = nbytes + int((before.get(name) or {}).get("detail", {}).get("bytes", 0))
    charge = egress_charge(src, total, region)
    egress = {"item": name, "amount": charge.amount, "currency": charge.currency,
              "usd": charge.amount * config.usd_per(charge.currency), "source": charge.source, "detail": charge.detail}
    egress["detail"].update(bytes=total, moves=int((before.get(name) or {}).get("detail", {}).get("moves", 0)) + 1)
    transfer_before = (before.get("move transfer") or {}).get("detail", {})
    transfer = {"item": "move transfer", "amount": 0.0, "currency": "USD", "usd": 0.0, "source": "measured",
                "detail": {"seconds": round(float(transfer_before.get("seconds", 0.0)) + seconds, 3),
                           "moves": int(transfer_before.get("moves", 0)) + 1}}
    put_run_items(state, run_id, [egress, transfer])


def lines(run: dict) -> list[str]:
    """The report's lines for a run's moves between clouds (none for a run that stayed in one)."""
    out = []
    for name, item in sorted((run.get("run_items") or {}).items()):
        d = item.get("detail") or {}
        if name.startswith("move egress "):
            out.append(f"{name}: {d.get('gb', 0):.4g} GB at {d.get('per_gb', 0):g} {item['currency']}/GB "
                       f"({item['source']}) = ${item['usd']:.4f}, {d.get('moves', 1)} move(s)")
        elif name == "move transfer":
            out.append(f"move transfer: {d.get('seconds', 0):g} s copying checkpoints between clouds")
    return out


__all__ = ["put_run_items", "record_move", "lines"]
