"""`sdcloud catalog refresh` and `sdcloud catalog show`."""

from __future__ import annotations

from collections import defaultdict

import click

from ..offers.catalog import load_provider, stale_warning
from ..providers.traits import has_catalog, names, traits
from ..errors import UserError
from ..render import emit_json, note, output_options, table, wide_option
from .common import provider_choice


@click.group()
def catalog() -> None:
    """Refresh or show the GPU offer catalog."""


def _refresher(provider: str):
    """The provider's refresh_catalog(regions) -> (path, rows, errors), imported only now."""
    from ..providers.loader import catalog_refresh

    fn = catalog_refresh(provider)
    if fn is None:
        raise UserError(f"catalog refresh for {provider} is not available in this version of sdcloud")
    return fn


@catalog.command()
@output_options
@wide_option
@click.option("--provider", required=True, type=provider_choice(has_catalog), help="Which provider's catalog to refresh.")
@click.option("--region", "regions", multiple=True, metavar="REGION",
              help="Region to refresh (repeatable; default: the catalog's regions).")
@click.option("--public", is_flag=True, help="AWS: on-demand prices from the public bulk price list and bands from the "
              "spot advisor data, without credentials (per-zone spot prices stay as they were).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def refresh(provider: str, regions: tuple[str, ...], public: bool, as_json: bool) -> None:
    """Fetch instance facts and current prices from the provider's APIs (or, with --public, what AWS publishes)."""
    if public:
        if not traits(provider).public_price_list:
            public = " or ".join(names(where=lambda t: t.public_price_list))
            raise UserError(f"--public is for --provider {public} ({provider} publishes no machine-readable price list)")
        from ..providers.loader import public_prices

        refresh_public = public_prices(provider)
        assert refresh_public is not None  # public_price_list says it has one
        path, rows, errors = refresh_public(list(regions) or None)
    else:
        path, rows, errors = _refresher(provider)(list(regions) or None)
    per_region: dict[str, dict] = defaultdict(lambda: {"types": set(), "zones": set(), "spot_prices": 0, "ondemand_prices": 0})
    for r in rows:
        if regions and r.region not in regions:
            continue
        s = per_region[r.region]
        s["types"].add(r.instance_type)
        if r.zone:
            s["zones"].add(r.zone)
        s["spot_prices"] += r.spot_price is not None
        s["ondemand_prices"] += r.ondemand_price is not None
    summary = {region: {"types": len(s["types"]), "zones": sorted(s["zones"]), "spot_prices": s["spot_prices"],
                        "ondemand_prices": s["ondemand_prices"]} for region, s in sorted(per_region.items())}
    if as_json:
        emit_json({"provider": provider, "path": str(path), "rows": len(rows), "regions": summary, "errors": errors})
        return
    for err in errors:
        note(f"warning: {err}", wrap=True)
    table(f"{provider} catalog refreshed: {path}", ["region", "types", "zones", "spot prices", "on-demand prices"],
          [(region, s["types"], len(s["zones"]), s["spot_prices"], s["ondemand_prices"]) for region, s in summary.items()],
          caption=f"{len(rows)} rows in all" + (f"; {len(errors)} problems (above)" if errors else ""))


@catalog.command()
@output_options
@wide_option
@click.option("--provider", type=provider_choice(has_catalog), help="One provider (default: all).")
@click.option("--region", metavar="REGION", help="One region.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def show(provider: str | None, region: str | None, as_json: bool) -> None:
    """Show the catalog in use: where it comes from, how old it is, and its rows."""
    providers = (provider,) if provider else names(where=has_catalog)
    rows, sources = [], []
    for p in providers:
        prov_rows, source = load_provider(p)
        rows.extend(r for r in prov_rows if region is None or r.region == region)
        sources.append(source)
    if region is not None and not rows:
        raise UserError(f"no catalog rows for region {region!r}")
    if as_json:
        emit_json({"sources": [{"provider": s.provider, "origin": s.origin,
                                "as_of": s.as_of.isoformat() if s.as_of else None,
                                "oldest_price": s.oldest.isoformat() if s.oldest else None,
                                "path": s.path} for s in sources],
                   "rows": [{**r.as_dict(), "vram_mib": r.usable_vram_mib,
                             "ondemand_age_days": r.price_age_days("on-demand"), "spot_age_days": r.price_age_days("spot")}
                            for r in rows]})
        return
    for s in sources:
        note(s.describe(), wrap=True)
    warning = stale_warning(sources)
    if warning:
        note(warning, wrap=True)
    table("GPU offer catalog", ["provider", "region", "zone", "type", "GPU", "VRAM MiB/GB", "vCPU", "RAM", "NVMe",
                                "on-demand", "spot", "cur", "band"],
          [(r.provider, r.region, r.zone or "*", r.instance_type, f"{r.gpu_count}x {r.gpu}",
            f"{r.usable_vram_mib}/{r.vram_gb:g}", r.vcpus,
            f"{r.memory_gb:g}", f"{r.nvme_gb:g}",
            "" if r.ondemand_price is None else f"{r.ondemand_price:g}" + ("~" if r.ondemand_estimate else ""),
            "" if r.spot_price is None else f"{r.spot_price:g}" + ("~" if r.spot_estimate else ""),
            r.currency, "" if r.interruption_band is None else r.interruption_band) for r in rows],
          drop=["NVMe", "RAM", "vCPU", "band", "VRAM MiB/GB", "provider", "GPU"],
          caption=_show_caption)


def _show_caption(shown: set[str]) -> str:
    """The footer of `catalog show`: it explains only the columns the table shows."""
    parts = []
    if "VRAM MiB/GB" in shown:
        parts.append("VRAM = usable MiB as the driver reports it / nominal GB")
    parts += ["~ = estimated price", "zone * = the price holds in every zone of the region",
              "--json has each price's basis, source and date"]
    return "; ".join(parts)
