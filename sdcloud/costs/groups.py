"""A multi-node run's costs (`up --nodes N`): each host priced, the group added up.

The hosts of a group are one unit: launched together in one zone and one market at one type's price,
ended together (a reclaim of one ends all). So an attempt's compute and disk are its one host's items
times N, each host's hours are the attempt's, and the group's price per hour is N x the host's. The
cost report shows each node's hours and cost and the group's totals (`nodes` in its JSON).
"""

from __future__ import annotations

from .. import config
from ..offers.groups import group_price, node_count

GROUP_ITEMS = ("compute", "disk")  # what each host bills; the bucket and requests are the run's, once


def spec_nodes(spec) -> int:
    """The hosts of each attempt of a run with this spec (its `nodes`; 1 for a single host or a batch job)."""
    return node_count(spec if isinstance(spec, dict) else None)


def run_nodes(state, run_id: str) -> int:
    return spec_nodes((state.get_run(run_id) or {}).get("spec"))


def scale_items(items: list[dict], nodes: int) -> list[dict]:
    """One host's priced items as the group's: compute and disk times `nodes`, each host's share kept."""
    if nodes <= 1:
        return items
    out = []
    for it in items:
        if it["item"] in GROUP_ITEMS:
            detail = {**(it.get("detail") or {}), "nodes": nodes, "per_node_usd": it["usd"],
                      "per_node_amount": it["amount"]}
            if detail.get("price_per_hour") is not None:  # the host's; the group's is N times it
                detail["price_per_hour_usd"] = detail["price_per_hour"] * config.usd_per(it["currency"])
            it = {**it, "amount": it["amount"] * nodes, "usd": it["usd"] * nodes, "detail": detail}
        out.append(it)
    return out


def node_view(attempts: list[dict], nodes: int) -> dict | None:
    """Each node's hours and cost over the run's attempts, and the group's totals; None for one host."""
    if nodes <= 1:
        return None
    per_node = []
    for rank in range(nodes):
        hours = sum(a["hours"] for a in attempts)
        usd = sum(a["items"][i]["detail"].get("per_node_usd", 0.0) for a in attempts for i in GROUP_ITEMS
                  if i in a["items"])
        per_node.append({"node": rank, "hours": round(hours, 4), "usd": round(usd, 4)})
    prices = [a["items"]["compute"]["detail"].get("price_per_hour_usd") for a in attempts if "compute" in a["items"]]
    last = next((p for p in reversed(prices) if p is not None), None)
    return {"nodes": nodes, "per_node": per_node,
            "node_hours": round(sum(n["hours"] for n in per_node), 4),
            "usd": round(sum(n["usd"] for n in per_node), 4),
            "host_price_per_hour_usd": round(last, 4) if last is not None else None,
            "group_price_per_hour_usd": round(group_price(last, nodes), 4) if last is not None else None}


def line(view: dict | None) -> str:
    """The report's line under a multi-node run's table: each node, then the group."""
    if not view:
        return ""
    nodes = "; ".join(f"node {n['node']}: {n['hours']:.2f} h ${n['usd']:.2f}" for n in view["per_node"])
    price = (f", ${view['group_price_per_hour_usd']:.4f}/h ({view['nodes']} x ${view['host_price_per_hour_usd']:.4f})"
             if view["group_price_per_hour_usd"] is not None else "")
    return f"{view['nodes']} nodes: {nodes}; group {view['node_hours']:.2f} node-hours, ${view['usd']:.2f}{price}"
