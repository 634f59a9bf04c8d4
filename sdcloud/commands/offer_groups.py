"""`sdcloud offers --nodes N`: groups of N same-type hosts in one zone, with their speed-up and group price."""

from __future__ import annotations

from ..offers.groups import OVERLAP, SOCKET_EFFICIENCY, Link, rank_groups
from ..render import echo, emit_json, note, table


def show_groups(tier, catalog, nodes: int, steps: int | None, limit: int, explain: bool, as_json: bool,
                filters: dict) -> None:
    ranked = rank_groups(tier, catalog, nodes, job_size=steps, **filters)
    shown = ranked[:limit] if limit else ranked
    if as_json:
        emit_json([g.as_dict() for g in shown])
        return
    job = steps or tier.job_size
    if not ranked:  # every offer's group is no faster than one host (or nothing fits the filters)
        note(f"no group of {nodes} {tier.name} hosts is faster than one host on the offers that fit: their network "
             f"cannot carry the all-reduce (docs/training.md, \"Multi-node\"); try fewer --nodes, another type, "
             f"or sdcloud offers --tier {tier.name} for one host", wrap=True)
        return
    if not explain:
        table(f"{tier.name}: {job} {tier.unit} on {nodes} hosts, cheapest to finish first",
              ["#", "provider", "region", "type", "market", "group $/h", "speed-up", "est h", "est $"],
              [(i + 1, g.host.offer.row.provider, g.host.offer.row.region, g.host.offer.row.instance_type,
                g.host.offer.market, f"{g.price_per_hour_usd:.4f}", f"{g.speedup:.2f}x", f"{g.est_hours:.2f}",
                f"{g.est_cost:.2f}") for i, g in enumerate(shown)],
              drop=["#", "est h", "market"],
              caption=f"{len(ranked)} groups fit; group $/h = {nodes} x the host's; --explain shows the speed-up model")
        return
    # At 80 columns the figures a group is ranked by come first (speed-up, est h, est $), beside the offer
    # (its market in it); the group's price, network, overhead and the network's source give way in turn.
    rows = []
    for i, g in enumerate(shown):
        r = g.host.offer.row
        rows.append((i + 1, f"{r.provider} {r.region} {r.instance_type} {g.host.offer.market}",
                     f"{g.speedup:.2f}x", f"{g.est_hours:.2f}", f"{g.est_cost:.2f}",
                     f"{nodes}x{g.host.offer.price_per_hour_usd:.4f}={g.price_per_hour_usd:.4f}",
                     f"{g.efficiency:.0%}", _network(g.link), f"{g.overhead:.3f}", g.link.source))
    hidden = table(f"{tier.name}: {job} {tier.unit} on {nodes} hosts, why each group ranks where it does",
                   ["#", "offer", "speed-up", "est h", "est $", "group $/h", "of N", "network", "overhead",
                    "network source"],
                   rows, wrap=["offer", "network", "network source"],
                   drop=["network source", "overhead", "network", "of N", "group $/h"])
    parts = [f"speed-up = N x step / (step + max(0, all-reduce - {OVERLAP:g} x step)); all-reduce = 2 (N-1)/N x "
             f"trained parameters x 2 bytes (bf16) / (min(line rate of one interface, flows x one flow's cap) x "
             f"{SOCKET_EFFICIENCY:g})", _flow_words(shown)]
    if "of N" not in hidden:
        parts.append("of N: the speed-up as a share of N hosts")
    if "overhead" not in hidden:
        parts.append("overhead = 1 + N x reclaims/h x restart")
    parts.append("est h and est $ include the overhead of reclaims; "
                 "docs/training.md, \"Multi-node: offers, stacks and costs\"")
    echo("; ".join(parts))


def _network(link: Link) -> str:
    """A link in a few words: one interface's rate (of the host's, on a multi-card type) and the placement."""
    rate = f"{link.gbps:g} Gbps {link.basis}"
    if link.cards > 1 and link.host_gbps is not None:
        rate += f" (1 of {link.cards} cards, {link.host_gbps:g} a host)"
    return rate + (", cluster" if link.placement == "cluster" else ", one zone")


def _flow_words(shown: list) -> str:
    """The flow limits of the providers shown, as their network traits declare them."""
    seen: dict[str, str] = {}
    for g in shown:
        link, provider = g.link, g.host.offer.row.provider
        where = "in a cluster placement group" if link.placement == "cluster" else "in one zone"
        seen.setdefault(f"{provider} {where}", f"{link.flows} x {link.flow_gbps:g} Gbps")
    return "flows: " + ", ".join(f"{k} {v}" for k, v in seen.items())
