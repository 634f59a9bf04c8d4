"""The hosts of a multi-node run (`--nodes N`) as `status` and `watch` show them: each node's rank,
phase, step and heartbeat age, read from the status.json each host writes to the run's bucket
(rank 0 the run's own, the others runs/<id>/nodes/<rank>/status.json: sdcloud_agent/agent_nodes.py).
"""

from __future__ import annotations

import json
import time
from typing import Any

from ...offers.groups import node_count as nodes_in

# A host whose heartbeat is older than this while its attempt runs is shown as silent.
SILENT_AFTER_S = 60.0


def node_key(run_id: str, rank: int) -> str:
    return f"runs/{run_id}/status.json" if rank == 0 else f"runs/{run_id}/nodes/{rank}/status.json"


def node_count(run: dict) -> int:
    return nodes_in(run.get("spec") or {})


def read_nodes(run: dict, store: Any = None, now: float | None = None) -> list[dict] | None:
    """One record per host of the run's newest attempt, None for a single-host run. A host that
    has not written yet (booting, or of an older attempt) is shown as such, not left out."""
    n = node_count(run)
    if n <= 1:
        return None
    if store is None:
        from .store_of import store_of

        try:
            store = store_of(run)
        except Exception:  # noqa: BLE001 - no bucket reachable here: nothing to show
            return None
    now = time.time() if now is None else now
    docs: list[dict | None] = []
    for rank in range(n):
        try:
            docs.append(json.loads(store.get(node_key(run["id"], rank))))
        except Exception:  # noqa: BLE001 - not written yet
            docs.append(None)
    attempt = max((int(d.get("attempt") or 0) for d in docs if d), default=0)
    out = []
    for rank, doc in enumerate(docs):
        if not doc or int(doc.get("attempt") or 0) != attempt:
            out.append({"node": rank, "rank": rank, "attempt": attempt or None, "phase": "waiting", "step": None,
                        "age_s": None, "health": "no report yet"})
            continue
        age = round(max(0.0, now - float(doc.get("time") or now)), 1)
        verdict = (doc.get("health") or {}).get("verdict") if isinstance(doc.get("health"), dict) else None
        phase = doc.get("phase") or "starting"
        final = phase in ("succeeded", "failed", "preempted")
        health = ("silent" if age > SILENT_AFTER_S and not final else verdict or ("ok" if not final else "ended"))
        out.append({"node": rank, "rank": rank, "attempt": attempt, "phase": phase, "step": doc.get("step"),
                    "age_s": age, "health": health, "reason": doc.get("reason") or ""})
    return out


def node_lines(nodes: list[dict]) -> list[str]:
    """One line a host: `node 1 (rank 1): training, step 11, healthy, beat 2s ago`."""
    lines = []
    for n in nodes:
        parts = [f"node {n['node']} (rank {n['rank']}): {n['phase']}"]
        if n.get("step") is not None:
            parts.append(f"step {n['step']}")
        parts.append(str(n["health"]))
        if n.get("age_s") is not None:
            parts.append(f"beat {n['age_s']:.0f}s ago")
        lines.append(", ".join(parts))
    return lines


def node_hours(attempts: list[dict], nodes: int) -> list[dict]:
    """Each host's hours and price in each attempt of a group run, and the group's totals: the
    hosts of a group start and end together (one instance to the controller), so each bills the
    attempt's hours at its share of the group's price."""
    rows = []
    for a in attempts:
        share = None if a.get("price") is None else round(a["price"] / nodes, 6)
        for k in range(nodes):
            rows.append({"attempt": a["n"], "node": k, "hours": a["hours"], "price": share,
                         "cost": round(a["cost"] / nodes, 6) if a.get("cost") is not None else None})
    return rows


def node_hours_line(summ: dict) -> str | None:
    """`2 nodes: 0.008 node-hours (node 0 0.004 h, node 1 0.004 h)` for the cost summary."""
    rows = summ.get("node_hours")
    if not rows:
        return None
    per: dict[int, float] = {}
    for r in rows:
        per[r["node"]] = per.get(r["node"], 0.0) + float(r["hours"] or 0)
    each = ", ".join(f"node {k} {h:.3f} h" for k, h in sorted(per.items()))
    return f"{len(per)} nodes: {sum(per.values()):.3f} node-hours ({each})"


def group_status(doc: dict | None, store: Any, run_id: str, nodes: int) -> dict | None:
    """Rank 0's status.json as the controller reads it, with the group folded in: while rank 0
    has not ended, another host of the same attempt that failed (it could not join the rendezvous,
    its agent broke) fails the group's attempt with that host's reason, so the controller ends
    every host at once rather than wait for rank 0's trainer to time out."""
    if nodes <= 1 or not doc or doc.get("phase") in ("succeeded", "failed", "preempted"):
        return doc
    for rank in range(1, nodes):
        try:
            other = json.loads(store.get(node_key(run_id, rank)))
        except Exception:  # noqa: BLE001 - not written yet, or unreadable this step
            continue
        if other.get("attempt") == doc.get("attempt") and other.get("phase") == "failed":
            return {**doc, "phase": "failed", "reason": f"node {rank}: {other.get('reason') or 'failed'}",
                    "failure_cause": other.get("failure_cause") or "agent-error", "failed_node": rank,
                    **({"boot_phase": other["boot_phase"]} if other.get("boot_phase") else {})}
    return doc
