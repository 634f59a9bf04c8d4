"""Options several commands share: the market flags, and shell completion of names a user types."""

from __future__ import annotations

import click

from ..errors import UserError


def complete_tiers(ctx, param, incomplete: str):
    from ..offers.tiers import all_tiers

    return [t for t in all_tiers() if t.startswith(incomplete.lower())]


def complete_providers(ctx, param, incomplete: str):
    from ..providers import NAMES

    return [p for p in NAMES if p.startswith(incomplete.lower())]


def complete_regions(ctx, param, incomplete: str):
    from ..offers.catalog import load_catalog

    try:
        regions = sorted({r.region for r in load_catalog().rows})
    except Exception:  # completion must never print a traceback into the shell
        return []
    return [r for r in regions if r.startswith(incomplete)]


def complete_runs(ctx, param, incomplete: str):
    try:
        from ..runs.state import StateStore

        runs = StateStore().list_runs()
    except Exception:
        return []
    names = [r["id"] for r in runs] + [r["name"] for r in runs if r.get("name")]
    return [n for n in names if n.startswith(incomplete)]


def market_options(f):
    """--spot and --on-demand as two flags that exclude each other (passed on as `market`)."""
    def pick(ctx, param, value):
        return value

    f = click.option("--on-demand", "on_demand", is_flag=True, default=None, callback=pick,
                     help="On-demand capacity only.")(f)
    f = click.option("--spot", "spot", is_flag=True, default=None, callback=pick,
                     help="Spot capacity (the default), with on-demand to meet a deadline.")(f)
    return f


def market_of(spot: bool | None, on_demand: bool | None) -> str | None:
    if spot and on_demand:
        raise UserError("--spot and --on-demand exclude each other: pass one of them")
    return "spot" if spot else "on-demand" if on_demand else None
