"""`sdcloud speeds`: the rates runs observed and the user recorded, beside the catalog's; add and forget."""

from __future__ import annotations

import click

from ..errors import UserError
from ..render import emit_json, output_options, table, wide_option
from .common import complete_tiers, state_store


def _gpu(name: str) -> str:
    from ..names import match_name
    from ..offers.gpus import gpu_table

    return match_name(name, gpu_table(), "GPU")


def _tier(name: str) -> str:
    from ..offers.tiers import get_tier

    return get_tier(name).name


def _trainer(name: str | None) -> str:
    if name is None:
        return ""
    from ..names import match_name
    from ..runs.spec import TRAINERS

    return match_name(name, TRAINERS, "trainer")


def _when(t: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


@click.group(invoke_without_command=True)
@output_options
@wide_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def speeds(ctx: click.Context, as_json: bool) -> None:
    """List the rates runs measured and you recorded, beside the catalog's figure."""
    if ctx.invoked_subcommand is not None:
        return
    from ..speeds.listing import summaries

    state = state_store()
    found = summaries(state)
    if as_json:
        emit_json(found)
        return
    table("Recorded and observed rates", ["tier", "GPU", "host", "trainer", "origin", "rate", "runs", "catalog",
                                          "last seen", "note"],
          [(s["tier"], f"{s['gpu_count']}x {s['gpu']}" if s["gpu"] else "?",
            f"{s['provider']} {s['instance_type']}" if s["instance_type"] else (s["provider"] or "any"),
            (s["trainer"] or "any") + (f" ({s['recipe']})" if s["recipe"] else ""), s["origin"],
            f"{s['rate']:.3g}" if s["rate"] is not None else "-", s["runs"] if s["runs"] is not None else "",
            f"{s['catalog_rate']:.3g}" if s["catalog_rate"] is not None else "-", _when(s["last_seen"]), s["note"] or "")
           for s in found],
          drop=["note", "last seen", "trainer", "host", "runs"], wrap=["host", "note"],
          caption="rates in steps/s (images/s for batch tiers) on the host, before reclaims; "
                  "offers use them in the catalog's place",
          empty="no rates yet: each finished run records its own; add one with sdcloud speeds add --gpu G --tier T --rate R")


@speeds.command()
@output_options
@click.option("--gpu", required=True, metavar="GPU", help="The GPU it was measured on (as in sdcloud tiers), e.g. L40S.")
@click.option("--tier", "tier_name", required=True, metavar="TIER", shell_complete=complete_tiers, help="Workload tier.")
@click.option("--rate", required=True, type=float, metavar="R", help="Steps/s (images/s for batch tiers) on one GPU.")
@click.option("--trainer", metavar="TRAINER", help="The trainer it was measured with (default: any).")
@click.option("--note", default="", metavar="TEXT", help="Where the figure comes from.")
@click.option("--json", "as_json", is_flag=True, help="Print the recorded figure as JSON.")
def add(gpu: str, tier_name: str, rate: float, trainer: str | None, note: str, as_json: bool) -> None:
    """Record a rate measured elsewhere (a bench, another tool); it replaces one of the same key."""
    from ..speeds.records import add_recorded

    if not rate > 0 or rate != rate or rate == float("inf"):
        raise UserError(f"--rate must be a positive number of steps (or images) per second, got {rate:g}")
    gpu, tier_name, trainer_name = _gpu(gpu), _tier(tier_name), _trainer(trainer)
    if "\n" in note:
        raise UserError("--note must be one line")
    state = state_store()
    row_id = add_recorded(state, gpu, tier_name, rate, trainer=trainer_name, note=note.strip())
    if as_json:
        emit_json({"id": row_id, "gpu": gpu, "tier": tier_name, "rate": rate, "trainer": trainer_name or None,
                   "note": note.strip() or None, "origin": "recorded"})
        return
    click.echo(f"recorded {rate:g}/s for {tier_name} on {gpu}" + (f" with {trainer_name}" if trainer_name else "")
               + "; sdcloud offers uses it for every host of that GPU")


@speeds.command()
@output_options
@click.option("--gpu", metavar="GPU", help="Only figures on this GPU.")
@click.option("--tier", "tier_name", metavar="TIER", shell_complete=complete_tiers, help="Only figures of this tier.")
@click.option("--trainer", metavar="TRAINER", help="Only figures of this trainer.")
@click.option("--observed", is_flag=True, help="Forget what runs observed too (default: recorded figures only).")
@click.option("--id", "row_id", type=int, metavar="N", help="One figure by its id (sdcloud speeds --json, ids).")
def forget(gpu: str | None, tier_name: str | None, trainer: str | None, observed: bool, row_id: int | None) -> None:
    """Remove recorded figures (and with --observed, observed ones) that match every key given."""
    from ..speeds.records import RECORDED, forget as forget_rows

    if gpu is None and tier_name is None and trainer is None and row_id is None:
        raise UserError("say which figures to forget: --gpu, --tier, --trainer or --id (see: sdcloud speeds)")
    keys = dict(gpu=_gpu(gpu) if gpu else None, tier=_tier(tier_name) if tier_name else None,
                trainer=_trainer(trainer) if trainer else None, row_id=row_id)
    state = state_store()
    removed = forget_rows(state, origin=None if observed or row_id is not None else RECORDED, **keys)
    if not removed:
        raise UserError("no figure matches; see: sdcloud speeds")
    click.echo(f"forgot {removed} figure{'s' if removed != 1 else ''}")


@speeds.command()
@output_options
def export() -> None:
    """Print every recorded and observed figure as JSON, with the reclaims per hour of each zone."""
    from ..speeds.listing import export as export_rows

    emit_json(export_rows(state_store()))


