"""`sdcloud offers --nodes N`: groups of N same-type hosts in one zone, with their speed-up and group price."""

from __future__ import annotations

from ..offers.groups import FLOWS, OVERLAP, SINGLE_FLOW_GBPS, SOCKET_EFFICIENCY, rank_groups
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
    rows = []
    for i, g in enumerate(shown):
        r = g.host.offer.row
        rows.append((i + 1, f"{r.provider} {r.region} {r.instance_type}", g.host.offer.market,
                     f"{nodes} x {g.host.offer.price_per_hour_usd:.4f} = {g.price_per_hour_usd:.4f}",
                     f"{g.link.gbps:g} Gbps ({g.link.basis}), "
                     + ("cluster placement group" if g.link.placement == "cluster" else "one zone"),
                     f"{g.speedup:.2f}x ({g.efficiency:.0%} of {nodes})", f"{g.overhead:.3f}",
                     f"{g.est_hours:.2f}", f"{g.est_cost:.2f}", g.link.source))
    table(f"{tier.name}: {job} {tier.unit} on {nodes} hosts, why each group ranks where it does",
          ["#", "offer", "market", "group $/h", "network", "speed-up", "overhead", "est h", "est $", "network source"],
          rows, wrap=["offer", "network", "network source"], drop=["network source", "overhead"])
    echo(f"speed-up = N x step / (step + max(0, all-reduce - {OVERLAP:g} x step)); all-reduce = 2 (N-1)/N x "
         f"trained parameters x 2 bytes (bf16) / (min(line rate, {FLOWS} flows x {SINGLE_FLOW_GBPS['cluster']:g} Gbps in a "
         f"cluster placement group or {SINGLE_FLOW_GBPS['zone']:g} outside) x {SOCKET_EFFICIENCY:g}); "
         f"overhead = 1 + N x reclaims/h x restart; docs/training.md, \"Multi-node: offers, stacks and costs\"")
