"""`sdcloud simulate`: replay spot availability traces through the spot policies."""

from __future__ import annotations

import click

from ..errors import UserError
from ..render import emit_json, note, output_options, table, wide_option


@click.command()
@output_options
@wide_option
@click.option("--trace", "traces", multiple=True, required=True, metavar="FILE",
              help="Availability trace (JSON, one value per tick, > 0 = spot). Several = several zones.")
@click.option("--job-hours", type=float, required=True, help="C: hours of work the job needs.")
@click.option("--deadline-hours", type=float, required=True, help="R: hours from start to deadline.")
@click.option("--restart-hours", type=float, required=True, help="d: hours lost on every launch, move or restart.")
@click.option("--spot-price", type=float, default=0.9731, show_default=True, help="Spot USD per hour.")
@click.option("--ondemand-price", type=float, default=3.06, show_default=True, help="On-demand USD per hour.")
@click.option("--policy", "policies", multiple=True, metavar="P",
              help="Policy to replay (repeatable; default all): on-demand, greedy, uniform-progress, sdcloud, sdcloud-up, optimal.")
@click.option("--starts", type=int, default=300, show_default=True, help="Random start points (the same for every policy).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for the start points.")
@click.option("--single-zone", is_flag=True, help="Keep every policy to the zone it started in.")
@click.option("--tick", "tick_seconds", type=int, help="Coarsen the traces to this tick (seconds); a tick counts as "
              "available only if spot was there all through it.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per policy.")
def simulate(traces: tuple[str, ...], job_hours: float, deadline_hours: float, restart_hours: float, spot_price: float,
             ondemand_price: float, policies: tuple[str, ...], starts: int, seed: int, single_zone: bool,
             tick_seconds: int | None, as_json: bool) -> None:
    """Replay spot availability traces through the spot policies; savings are against on-demand."""
    from ..spot import simulate as sim

    setting = sim.Setting(job_hours, deadline_hours, restart_hours, spot_price, ondemand_price)
    setting.check()
    names = list(policies) or sim.all_policy_names()
    known = sim.all_policy_names()
    for name in names:
        if name not in known:
            raise UserError(f"unknown policy {name!r}; choose from: {', '.join(known)}")
    if tick_seconds is not None and tick_seconds <= 0:
        raise UserError(f"--tick must be a positive number of seconds, got {tick_seconds}")
    loaded = [sim.load_trace(path) for path in traces]
    if tick_seconds is not None:
        loaded = [sim.coarsen(t, tick_seconds) for t in loaded]
    avail, gap, keys = sim.stack(loaded)
    if sim.OPTIMAL in names and gap < 120:
        note(f"optimal: {gap} s ticks make the dynamic programme slow; --tick 300 or more speeds it up")
    results = sim.simulate(avail, keys, gap, setting, names, starts=starts, seed=seed, single_zone=single_zone)
    if as_json:
        emit_json([r.as_dict() for r in results])
        return
    mode = "single zone" if single_zone or len(keys) == 1 else f"{len(keys)} zones"
    table(f"C={job_hours:g} h, R={deadline_hours:g} h (C/R={job_hours / deadline_hours:.2f}), d={restart_hours:g} h, {mode}",
          ["policy", "mean savings", "deadline met", "mean cost $", "starts"],
          [(r.policy, f"{100 * r.savings.mean():.1f}%", f"{100 * r.met.mean():.1f}%", f"{r.costs.mean():.2f}", len(r.costs))
           for r in (x for x in results)],
          caption=f"savings = 1 - cost / (C x on-demand {ondemand_price:g} $/h); spot {spot_price:g} $/h; "
                  f"{gap} s ticks over {avail.shape[1] * gap / 3600:.0f} h; zones: {', '.join(keys)}")
