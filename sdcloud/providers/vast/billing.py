"""What Vast.ai charged each run: its invoices' charge lines per instance (GPU time, disk, bandwidth).

GET /users/me/invoices (vast.py `show invoices`) over the run's attempts; a charge line names its
instance. A paused instance's disk is charged too, so the bill is the ledger's compute plus what
the ledger estimates for disk and bytes (`sdcloud cost reconcile` sets them side by side).
"""

from __future__ import annotations

from typing import Any

from ...errors import UserError
from ..capabilities import Bill
from .session import Client, VastApiError

SOURCE = "vast-invoices"


def charges(client: Client, start: float, end: float) -> dict[str, dict[str, float]]:
    """{instance id: {kind: USD}} of every charge line over [start, end] (kind: gpu, storage, bandwidth)."""
    out: dict[str, dict[str, float]] = {}
    for line in client.invoices(start, end):
        if line.get("type") != "charge" or line.get("instance_id") is None:
            continue
        kinds = out.setdefault(str(line["instance_id"]), {})
        kind = str(line.get("kind") or "gpu")
        kinds[kind] = kinds.get(kind, 0.0) + float(line.get("amount") or 0.0)
    return out


def billed(state: Any, runs: list[dict], now: float, client: Any = None) -> dict[str, Bill]:
    """The charges of each of `runs` whose instances the invoices list (GPU, storage and bandwidth added up)."""
    client = client or Client()
    out: dict[str, Bill] = {}
    for r in runs:
        attempts = [a for a in state.attempts(r["id"]) if a.instance_id and a.start is not None]
        if not attempts:
            continue
        try:
            lines = charges(client, min(a.start for a in attempts) - 3600, now)
        except VastApiError as exc:
            raise UserError(f"Vast.ai invoices: {exc}") from None
        found = [lines[a.instance_id] for a in attempts if a.instance_id in lines]
        if found:
            out[r["id"]] = Bill(sum(sum(k.values()) for k in found), "USD", SOURCE)
    return out
