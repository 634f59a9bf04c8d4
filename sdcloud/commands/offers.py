"""`sdcloud tiers` and `sdcloud offers`."""

from __future__ import annotations

import click

from ..offers.catalog import load_catalog, max_age_days, stale_warning
from ..errors import UserError
from ..offers.optimizer import rank
from .common import (BATCH_TIER_NAMES, TRAIN_TIER_NAMES, USD_PER_HOUR, ProvidersHelp, complete_providers, complete_regions,
                     complete_tiers, market_of, market_options)
from ..render import emit_json, note, output_options, table, wide_option
from ..offers.tiers import all_tiers, get_tier

# What a start in another cloud copies there, for planning (`offers --move-gb`): an SDXL base model in
# fp16 (about 6.9 GB), a training set and a checkpoint; a run's own move copies what it really has.
MOVE_GB = 10.0


@click.command()
@output_options
@wide_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def tiers(as_json: bool) -> None:
    """List the workload tiers and what each needs."""
    items = list(all_tiers().values())
    if as_json:
        emit_json([t.as_dict() for t in items])
        return
    table("Workload tiers", ["tier", "VRAM min/rec", "GPUs", "vCPU", "RAM", "NVMe", "reference job", "fits", "description"],
          [(t.name, f"{t.min_vram_gb:g}/{t.rec_vram_gb:g} GB", t.gpu_count, t.vcpus, f"{t.memory_gb:g} GB", f"{t.nvme_gb:g} GB",
            f"{t.job_size} {t.unit} @ {t.resolution}px bs{t.batch_size}", " ".join(t.gpus_fit()), t.description) for t in items],
          drop=["description", "fits", "NVMe", "reference job", "RAM", "vCPU", "GPUs"], wrap=["description", "fits"],
          caption="VRAM is usable memory as the driver reports it; sources of each figure: "
                  "sdcloud tiers --json, or docs/tiers.md")


def _short_notes(est) -> str:
    """The estimate's warnings, shortened for a table cell (--json has them in full)."""
    short = {"vCPUs is below": "few vCPUs", "VRAM": "below rec. VRAM", "no local NVMe": "no NVMe", "NVMe is below": "small NVMe"}
    notes = [next((v for k, v in short.items() if k in w), w) for w in est.warnings]
    if est.move is not None:  # an offer outside the home cloud starts with a move (--explain: its inputs)
        notes.append(f"move +${est.offer.price_per_hour_usd * est.move.transfer_hours + est.move.egress_usd:.2f}")
    return ", ".join(notes)


@click.command()
@output_options
@wide_option
@click.option("--tier", "tier_name", required=True, metavar="TIER", shell_complete=complete_tiers,
              help="Workload tier: a training tier (" + ", ".join(TRAIN_TIER_NAMES) + ") or a batch tier ("
                   + ", ".join(BATCH_TIER_NAMES) + "); sdcloud tiers.")
@market_options
@click.option("--max-price", type=USD_PER_HOUR, metavar="USD", help="Highest price per hour, USD.")
@click.option("--provider", metavar="PROVIDER", shell_complete=complete_providers, cls=ProvidersHelp,
              help="{catalog}; aws,tencent ranks both in one table.")
@click.option("--region", metavar="REGION", shell_complete=complete_regions, help="One region, e.g. us-east-1 or ap-guangzhou.")
@click.option("--steps", type=int, metavar="N",
              help="Job size in steps (images for batch tiers) instead of the tier's reference job.")
@click.option("--limit", type=int, default=15, show_default=True, metavar="N", help="Rows to show (0 = all).")
@click.option("--explain", is_flag=True,
              help="Show why each row ranks where it does: price source and age, rate and its source, band, overhead.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list ranked by est_cost.")
@click.option("--nodes", type=int, default=1, show_default=True, metavar="N",
              help="Rank groups of N same-type hosts in one zone training together (training tiers).")
@click.option("--move-gb", type=float, default=MOVE_GB, show_default=True, metavar="GB",
              help="With several providers: GB (10^9 bytes) a start outside the first (the home) copies there: "
                   "inputs and checkpoint, priced at the home cloud's egress plus the copy's hours.")
def offers(tier_name: str, spot: bool | None, on_demand: bool | None, max_price: float | None, provider: str | None,
           region: str | None, steps: int | None, limit: int, explain: bool, as_json: bool, nodes: int = 1,
           move_gb: float = MOVE_GB) -> None:
    """Rank GPU offers by the expected cost to finish a job (not by price per hour)."""
    market = market_of(spot, on_demand)
    tier = get_tier(tier_name)
    from ..offers.groups import check_nodes

    check_nodes(tier, nodes)  # a batch tier's group is refused before anything is printed
    from ..providers.traits import has_catalog, names

    # Every provider's traits read first: each tells offers where its catalog and network facts lie.
    names(where=has_catalog)
    several = None  # `--provider aws,tencent`: those clouds' offers ranked in one table
    if provider:
        from ..names import match_name

        from ..runs.inputs.clouds import split

        found = [match_name(p, names(where=has_catalog), "provider") for p in split(provider)]
        if len(set(found)) != len(found):
            raise UserError(f"--provider {provider} names a provider twice; name each provider once")
        provider, several = (found[0], None) if len(found) == 1 else (None, found)
    if steps is not None and steps <= 0:
        raise UserError(f"--steps must be a positive whole number, got {steps}")
    if limit < 0:
        raise UserError(f"--limit must be 0 (all) or more, got {limit}")
    from ..runs.inputs.config_check import check_settings

    check_settings()  # config.toml's sections and keys ([currency] among them), named before anything is printed
    max_age_days()  # a bad setting is refused before anything is printed
    catalog = load_catalog(several)
    from ..runs.driving.lessons import user_book

    book = user_book()  # rates recorded (sdcloud speeds add) and observed by runs take the catalog's place
    if not move_gb >= 0:
        raise UserError(f"--move-gb must be 0 or more, got {move_gb:g}")
    if nodes > 1:
        from .offer_groups import show_groups

        show_groups(tier, catalog, nodes, steps, limit, explain, as_json,
                    dict(market=market, max_price=max_price, provider=provider, region=region, book=book))
        return
    egress = None
    if several:  # the home cloud's egress, in its region (or its default) and the account's currency
        from ..providers.loader import egress_price
        from ..providers.traits import default_region

        home_regions = {r.region for r in catalog.rows if r.provider == several[0]}
        egress = egress_price(several[0], region if region in home_regions else default_region(several[0]))
    ranked = rank(tier, catalog, market=market, max_price=max_price, provider=provider, region=region, job_size=steps,
                  book=book, clouds=several, move_bytes=int(move_gb * 1e9), move_egress=egress, move_network=_copy_rate)
    if provider:
        sources = [s for s in catalog.sources if s.provider == provider]
    else:
        sources = catalog.sources
    for source in sources:
        note(source.describe(), wrap=True)
    warning = stale_warning(sources)
    if warning:
        note(warning, wrap=True)
    for line in book.catalog_gaps(tier, [e.offer.row.gpu for e in ranked]):
        note(line, wrap=True)
    shown = ranked[:limit] if limit else ranked
    if as_json:
        emit_json([e.as_dict() for e in shown])
        return
    job = steps or tier.job_size
    if explain:
        _explain(tier, job, shown, len(ranked))
        return
    table(f"{tier.name}: {job} {tier.unit}, cheapest to finish first",
          ["#", "provider", "region", "type", "GPU", "VRAM", "market", "$/h", "est h", "est $", "interruption", "notes"],
          [(i + 1, e.offer.row.provider, e.offer.row.region, e.offer.row.instance_type,
            f"{e.offer.row.gpu_count}x {e.offer.row.gpu}", f"{e.offer.row.usable_vram_mib / 1024:.1f}/{e.offer.row.vram_gb:g} GB",
            e.offer.market,
            f"{e.offer.price_per_hour_usd:.4f}" + ("~" if _estimated(e) else ""),
            f"{e.est_hours:.2f}", f"{e.est_cost:.2f}", e.as_dict()["interruption"], _short_notes(e))
           for i, e in enumerate(shown)],
          drop=[c for c, fixed in (("provider", provider), ("region", region), ("market", market)) if fixed]
          + ["notes", "interruption", "GPU", "est h", "VRAM", "#"],
          caption=lambda columns: _caption(len(ranked), columns, any(_estimated(e) for e in shown)))


def _estimated(e) -> bool:
    """Whether a row's price is an estimate (marked ~), not a published figure."""
    return bool(e.offer.row.spot_estimate if e.offer.market == "spot" else e.offer.row.ondemand_estimate)


def _caption(total: int, shown: set[str], estimated: bool) -> str:
    """The footer of `offers`: it explains only the columns the table shows."""
    parts = [f"{total} offers fit"]
    if "VRAM" in shown:
        parts.append("VRAM = usable (as the driver reports it)/nominal")
    if estimated and "$/h" in shown:
        parts.append("~ = estimated price")
    from .. import config

    parts.append(f"prices in USD (CNY at {1 / config.usd_per('CNY'):g} per USD: cny_per_usd in config.toml)")
    if "est h" in shown:
        parts.append("est $ = $/h x est h")
    parts.append("--explain shows each row's inputs")
    return "; ".join(parts)


def _age(days: float | None) -> str:
    if days is None:
        return "no date"
    return f"{days * 24:.0f} h" if days < 2 else f"{days:.0f} d"


def _explain(tier, job: int, shown, total: int) -> None:
    """`offers --explain`: the inputs of each row's estimate, so a user can see why it ranks where it
    does. One table where it fits the terminal; where it does not, the ranking as a table and each
    row's inputs as lines under it, so that nothing the footer explains is left out."""
    from .. import render
    from ..offers.optimizer import CHECKPOINT_INTERVAL_HOURS, RESTART_HOURS, SETUP_HOURS

    rows = []
    for i, e in enumerate(shown):
        d = e.as_dict()
        r = e.offer.row
        # The reclaim rate the overhead used, and its source: the band, or what runs saw in the zone.
        reclaim = "" if e.reclaims_per_hour is None else f" ({e.reclaims_per_hour:.3g}/h, {e.reclaim_source})"
        if e.reclaims_per_hour is not None and e.restart_source != "assumed":
            reclaim += f"; restart {e.restart_hours * 60:.1f} min ({e.restart_source})"
        rows.append((i + 1, f"{r.provider} {r.region} {r.instance_type}", e.offer.market, f"{d['price_per_hour_usd']:.4f}",
                     f"{d['price_basis']}, {_age(d['price_age_days'])}", d["price_source"],
                     f"{d['rate']:.3g} {d['rate_unit']} ({d['speed_rel']:g}x A10G)", d["rate_source"],
                     d["interruption"] + reclaim,
                     f"{e.overhead:.3f}", f"{e.est_hours:.2f}", f"{e.est_cost:.2f}", _move_words(e)))
    columns = ["#", "offer", "market", "$/h", "price basis, age", "price source", "rate", "rate source",
               "interruption", "overhead", "est h", "est $", "move"]
    title = f"{tier.name}: {job} {tier.unit}, why each offer ranks where it does"
    formula = (f"{total} offers fit; est h = ({SETUP_HOURS:g} h setup + job / rate) x overhead; "
               f"overhead = 1 + reclaims/h x (restart, {RESTART_HOURS:g} h unless runs measured it, "
               f"+ {CHECKPOINT_INTERVAL_HOURS:g} h checkpoint / 2)"
               + ("; offers outside the home cloud (the first --provider) add a move: est h + copy hours, "
                  "est $ + the copy's hours at $/h + the home cloud's egress" if any(e.move for e in shown) else "")
               + "; docs/offers.md explains each column")
    # Cells wrap at spaces only: an offer's provider, region and type each stay whole.
    wrap = ["offer", "price source", "rate source", "move"]
    cells = [[str(v) for v in row] for row in rows]
    present = [i for i, _ in enumerate(columns) if any(c[i] for c in cells)]
    if render.fit_columns(columns, cells, render.console().width, wrap=wrap, wide=render.WIDE) == present:
        table(title, columns, rows, wrap=wrap, caption=formula)
        return
    table(title, ["#", "offer", "market", "$/h", "est h", "est $"],
          [(r[0], r[1], r[2], r[3], r[10], r[11]) for r in rows], wrap=["offer"], drop=["market", "est h"])
    for r in rows:
        render.echo(f"{r[0]}. {r[1]} ({r[2]}): price {r[3]} $/h, {r[4]}, from {r[5]}; speed {r[6]} on the host, "
                    f"from {r[7]}; interruption {r[8]}; overhead {r[9]}; est {r[10]} h, ${r[11]}"
                    + (f"; move: {r[12]}" if r[12] else ""))
    render.echo(formula)


def _copy_rate(row) -> tuple[float | None, str]:
    """The rate a destination host copies a move at: its network figure, on one flow to the internet
    (EC2's single-flow cap outside a placement group), not this machine's uplink."""
    from ..offers.groups import DEFAULT_FLOW_GBPS, link_of
    from ..providers.traits import traits

    link = link_of(row.provider, row.instance_type)
    network = traits(row.provider).network
    gbps = min(link.gbps, network.zone_flow_gbps if network is not None else DEFAULT_FLOW_GBPS)
    return gbps, f"{link.basis}, one flow" if gbps < link.gbps else link.basis


def _move_words(e) -> str:
    """A row's move from the home cloud, in words ('' at home): what `--explain` adds to its hours and cost."""
    m = e.offer and e.move
    if not m:
        return ""
    return f"{m.reason}; + {m.transfer_hours:.2f} h, + ${e.offer.price_per_hour_usd * m.transfer_hours + m.egress_usd:.2f}"
