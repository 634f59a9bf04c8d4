"""`sdcloud simulate`: replay spot availability traces through the spot policies."""

from __future__ import annotations

import click

from ..errors import UserError
from ..render import emit_json, note, output_options, table, wide_option


class _PolicyOption(click.Option):
    """--policy, whose help names the policies of the registry (spot/policy.py and the optimum) when shown,
    so that a policy added there is never missing here."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        from ..spot.simulate import all_policy_names

        record = super().get_help_record(ctx)
        return None if record is None else (record[0], record[1].replace("{names}", ", ".join(all_policy_names())))


@click.command()
@output_options
@wide_option
@click.option("--trace", "traces", multiple=True, required=True, metavar="[CLOUD:]FILE",
              help="Availability trace (JSON, one value per tick: > 0 = spot in the spot-traces format, 1 = preempted in "
                   "the SkyNomad one, or as metadata.data_means says). Several = several zones; "
                   "CLOUD:FILE puts the zone in a cloud, and a launch in another cloud than the checkpoint's is a move.")
@click.option("--job-hours", type=float, required=True, metavar="HOURS", help="C: hours of work the job needs.")
@click.option("--deadline-hours", type=float, required=True, metavar="HOURS", help="R: hours from start to deadline.")
@click.option("--restart-hours", type=float, required=True, metavar="HOURS",
              help="d: hours lost on every launch, move or restart.")
@click.option("--spot-price", type=float, default=0.9731, show_default=True, metavar="USD",
              help="Spot USD per hour, for zones without a price series of their own.")
@click.option("--prices", "prices_file", metavar="FILE",
              help="JSON object: trace name (file name less .json) -> spot price series, spread evenly over "
                   "that trace (as ../shared/data/spot-prices/v100_spot_prices.json). A trace's own 'prices' win.")
@click.option("--ondemand-price", type=float, default=3.06, show_default=True, metavar="USD",
              help="On-demand USD per hour, for traces without their own (metadata.price_info.on_demand_price).")
@click.option("--policy", "policies", multiple=True, metavar="P", cls=_PolicyOption,
              help="Policy to replay (repeatable): {names}. Default: all but sdcloud-one-cloud (one cloud) or "
                   "optimal (several clouds).")
@click.option("--starts", type=int, default=300, show_default=True, metavar="N",
              help="Random start points (the same for every policy).")
@click.option("--seed", type=int, default=0, show_default=True, metavar="N", help="Seed for the start points.")
@click.option("--single-zone", is_flag=True, help="Keep every policy to the zone it started in.")
@click.option("--tick", "tick_seconds", type=int, metavar="SECONDS",
              help="Coarsen the traces to this tick (seconds); a tick counts as "
              "available only if spot was there all through it.")
@click.option("--cloud-prices", "cloud_prices", multiple=True, metavar="CLOUD:SPOT:ONDEMAND[:CURRENCY]",
              help="Flat prices per hour for one cloud's zones, in its currency (CNY turned into USD at the "
                   "[currency] rate); wins over --prices there. Repeatable.")
@click.option("--move-hours", type=float, default=0.0, show_default=True, metavar="HOURS",
              help="Hours a move to another cloud adds to the restart: the checkpoint's copy.")
@click.option("--move-usd", type=float, default=0.0, show_default=True, metavar="USD",
              help="USD a move to another cloud costs: the checkpoint's egress from the source cloud.")
@click.option("--pauses", is_flag=True, help="Read each trace's unavailable ticks as pauses of one marketplace machine "
              "(an outbid Vast.ai host): the pause policy against always waiting and always relaunching; --spot-price "
              "is the bid, --ondemand-price the relaunch's (docs/policies.md, \"Pauses\").")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per policy.")
def simulate(traces: tuple[str, ...], job_hours: float, deadline_hours: float, restart_hours: float, spot_price: float,
             prices_file: str | None, ondemand_price: float, policies: tuple[str, ...], starts: int, seed: int,
             single_zone: bool, tick_seconds: int | None, cloud_prices: tuple[str, ...], move_hours: float,
             move_usd: float, pauses: bool, as_json: bool) -> None:
    """Replay spot availability traces through the spot policies; savings are against on-demand.

    Traces of two clouds (--trace aws:FILE --trace tencent:FILE) replay a job that may move between
    them, each move priced by --move-hours and --move-usd (docs/policies.md, "Across clouds")."""
    from ..spot import clouds as across
    from ..spot import simulate as sim

    setting = sim.Setting(job_hours, deadline_hours, restart_hours, spot_price, ondemand_price,
                          move_hours=move_hours, move_usd=move_usd)
    setting.check()
    if pauses:
        return _pauses(traces, setting, starts, seed, as_json)
    labels, paths = zip(*(across.split_trace(t) for t in traces))
    many = len(set(labels)) > 1
    priced = {p.cloud: p for p in (across.parse_cloud_prices(t) for t in cloud_prices)}
    across.check_priced(labels, priced)
    for p in priced.values():
        note(f"{p.cloud}: spot {p.spot_usd:.4g} $/h, on-demand {p.ondemand_usd:.4g} $/h ({p.words})")
    # By default: the optimum where it applies (it prices no moves), the one-cloud reference where there are clouds.
    names = list(policies) or [n for n in sim.all_policy_names() if n != (sim.OPTIMAL if many else sim.ONE_CLOUD)]
    known = sim.all_policy_names()
    for name in names:
        if name not in known:
            raise UserError(f"unknown policy {name!r}; choose from: {', '.join(known)}")
    if tick_seconds is not None and tick_seconds <= 0:
        raise UserError(f"--tick must be a positive number of seconds, got {tick_seconds}")
    loaded = [sim.load_trace(path) for path in paths]
    if prices_file is not None:
        series = _load_prices(prices_file)
        loaded = [t if t.prices is not None or t.key not in series or c in priced
                  else sim.with_prices(t, sim.stretch_series(series[t.key], len(t.avail))) for t, c in zip(loaded, labels)]
    loaded = across.label(loaded, labels)
    if tick_seconds is not None:
        loaded = [sim.coarsen(t, tick_seconds) for t in loaded]
    avail, gap, keys = sim.stack(loaded)
    if sim.OPTIMAL in names and gap < 120:
        note(f"optimal: {gap} s ticks make the dynamic programme slow; --tick 300 or more speeds it up")
    given = click.get_current_context().get_parameter_source("ondemand_price") is not click.core.ParameterSource.DEFAULT
    if many or priced:
        spot_prices, ondemand = across.zone_prices(loaded, labels, priced, spot_price, ondemand_price, given)
    else:
        ondemand = sim.ondemand_for(loaded, ondemand_price, fallback_given=given)
        spot_prices = sim.stack_prices(loaded, spot_price)
    results = sim.simulate(avail, keys, gap, setting, names, starts=starts, seed=seed, single_zone=single_zone,
                           spot_prices=spot_prices, ondemand_prices=ondemand, refused=sim.stack_refused(loaded),
                           clouds=labels if many else None)
    if as_json:
        emit_json([r.as_dict() for r in results])
        return
    mode = "single zone" if single_zone or len(keys) == 1 else f"{len(keys)} zones"
    if many:
        mode += f" in {len(set(labels))} clouds, a move {move_hours:g} h + {move_usd:g} $"
    table(f"C={job_hours:g} h, R={deadline_hours:g} h (C/R={job_hours / deadline_hours:.2f}), d={restart_hours:g} h, {mode}",
          ["policy", "mean savings", "deadline met", "mean cost $", "starts"] + (["moves (jobs moved)"] if many else []),
          [(r.policy, f"{100 * r.savings.mean():.1f}%", f"{100 * r.met.mean():.1f}%", f"{r.costs.mean():.2f}", len(r.costs))
           + ((f"{int(r.moves.sum())} ({int((r.moves > 0).sum())})",) if many and r.moves is not None else ())
           for r in results],
          caption=f"savings = 1 - cost / (C x on-demand {_ondemand_words(ondemand, ondemand_price)}); spot "
                  f"{'per zone from its series' if spot_prices is not None else f'{spot_price:g} $/h'}; "
                  f"{gap} s ticks over {avail.shape[1] * gap / 3600:.0f} h; zones: {', '.join(keys)}")


def _pauses(traces: tuple[str, ...], setting, starts: int, seed: int, as_json: bool) -> None:
    from ..spot import clouds as across, pause, simulate as sim

    if starts <= 0:
        raise UserError(f"--starts must be a positive number, got {starts}")
    loaded = [sim.load_trace(across.split_trace(t)[1]) for t in traces]
    rows = pause.compare(loaded, setting.job_hours, setting.deadline_hours, setting.spot_price, setting.ondemand_price,
                         setting.restart_hours, starts=starts, seed=seed)
    if as_json:
        emit_json(rows)
        return
    table(f"pauses: C={setting.job_hours:g} h, R={setting.deadline_hours:g} h, bid {setting.spot_price:g} $/h, "
          f"relaunch {setting.ondemand_price:g} $/h",
          ["choice", "mean hours", "mean cost $", "deadline met", "starts"],
          [(r["choice"], f"{r['mean_hours']:.2f}", f"{r['mean_usd']:.2f}", f"{r['deadline_met_pct']:.1f}%", r["runs"])
           for r in rows],
          caption="a trace's unavailable ticks read as one machine's pauses; a raise ends a pause, a relaunch "
                  "moves to an offer never paused (spot/pause.py)")


def _ondemand_words(ondemand, flat: float) -> str:
    if ondemand is None:
        return f"{flat:g} $/h"
    low, high = float(ondemand.min()), float(ondemand.max())
    return f"each zone's own, {low:g}-{high:g} $/h" if high > low else f"{low:g} $/h, the traces' own"


def _load_prices(path: str) -> dict[str, list[float]]:
    import json
    from pathlib import Path

    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"--prices file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"--prices file {path} is not readable JSON: {exc}") from None
    if not isinstance(doc, dict) or not all(
            isinstance(v, list) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 for x in v)
            for v in doc.values()):
        raise UserError(f"--prices file {path} must map trace names to non-empty lists of non-negative prices")
    return doc
