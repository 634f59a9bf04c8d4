"""`sdcloud speeds [add|forget|export]`: the rates runs observed and the user recorded, beside the catalog's.

One command with an optional action rather than a group: `sdcloud speeds` alone lists (a group given
no command shows its help, by the convention every group keeps)."""

from __future__ import annotations

import click

from ..errors import UserError
from ..render import emit_json, output_options, table, wide_option
from .common import complete_tiers, state_store

ACTIONS = ("list", "add", "forget", "export")
# Which options each action takes (the others are refused, so that a typo does not pass unseen).
TAKES = {"list": {"gpu", "tier_name", "as_json"}, "add": {"gpu", "tier_name", "rate", "trainer", "note", "force", "as_json"},
         "forget": {"gpu", "tier_name", "trainer", "observed", "row_id", "as_json"},
         "export": {"as_json"}}  # export prints JSON either way: --json, as its help says, is accepted
FLAGS = {"gpu": "--gpu", "tier_name": "--tier", "rate": "--rate", "trainer": "--trainer", "note": "--note",
         "as_json": "--json", "observed": "--observed", "row_id": "--id", "force": "--force"}


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
    from ..runs.inputs.spec import TRAINERS

    return match_name(name, TRAINERS, "trainer")


def _when(t: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


@click.command()
@output_options
@wide_option
@click.argument("action", required=False, default="list", metavar="[list|add|forget|export]")
@click.option("--gpu", metavar="GPU", help="The GPU (as in sdcloud tiers), e.g. L40S: add's figure; list/forget: only these.")
@click.option("--tier", "tier_name", metavar="TIER", shell_complete=complete_tiers,
              help="Workload tier: add's figure; list/forget: only these.")
@click.option("--rate", type=float, metavar="PER_SECOND", help="add: steps/s (images/s for batch tiers) on one GPU.")
@click.option("--trainer", metavar="TRAINER", help="add: the trainer it was measured with (default: any); forget: only these.")
@click.option("--note", metavar="WORDS", help="add: where the figure comes from (one line).")
@click.option("--force", is_flag=True, help="add: keep a figure more than 10x off the catalog's model for that GPU.")
@click.option("--observed", is_flag=True, help="forget: what runs observed too (default: recorded figures only).")
@click.option("--id", "row_id", type=int, metavar="N", help="forget: one figure by its id (sdcloud speeds --json, ids).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def speeds(action: str, **given) -> None:
    """List the rates runs measured and you recorded beside the catalog's figure; add one measured elsewhere
    (speeds add --gpu G --tier T --rate R), forget one, or export them all as JSON."""
    from ..names import match_name

    action = match_name(action, ACTIONS, "action")
    extra = [FLAGS[k] for k, v in given.items() if v not in (None, False) and k not in TAKES[action]]
    if extra:
        raise UserError(f"sdcloud speeds {action} takes no {', '.join(extra)} (see: sdcloud speeds --help)")
    if action == "add":
        return _add(**{k: given[k] for k in TAKES["add"]})
    if action == "forget":
        return _forget(**{k: given[k] for k in TAKES["forget"]})
    if action == "export":
        from ..speeds.listing import export

        return emit_json(export(state_store()))
    _list(**{k: given[k] for k in TAKES["list"]})


def _list(gpu: str | None, tier_name: str | None, as_json: bool) -> None:
    from ..speeds.listing import summaries

    from ..names import match_name
    from ..offers.gpus import gpu_table

    every = summaries(state_store())
    # A GPU of the table, or one a run was seen on (a local run's "CPU", an SSH box's card).
    gpu = match_name(gpu, list(gpu_table()) + sorted({s["gpu"] for s in every} - set(gpu_table())), "GPU") if gpu else None
    tier_name = _tier(tier_name) if tier_name else None
    found = [s for s in every if (gpu is None or s["gpu"] == gpu) and (tier_name is None or s["tier"] == tier_name)]
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


def _add(gpu: str | None, tier_name: str | None, rate: float | None, trainer: str | None, note: str | None,
         force: bool, as_json: bool) -> None:
    from ..names import has_controls, printable
    from ..speeds.figures import check_figure

    from ..speeds.records import add_recorded

    missing = [flag for flag, v in (("--gpu", gpu), ("--tier", tier_name), ("--rate", rate)) if v is None]
    if missing:
        raise UserError(f"sdcloud speeds add needs {', '.join(missing)} (e.g. --gpu L40S --tier sdxl-lora --rate 0.9)")
    assert gpu is not None and tier_name is not None and rate is not None
    if not 0 < rate < float("inf"):
        raise UserError(f"--rate must be a positive number of steps (or images) per second, got {rate:g}")
    note = (note or "").strip()
    if has_controls(note):  # a newline, a terminal escape: `speeds` would print it to the next user's screen
        raise UserError(f"--note must be one line of printable text, got {printable(note)}")
    gpu, tier_name, trainer_name = _gpu(gpu), _tier(tier_name), _trainer(trainer)
    check_figure(gpu, tier_name, rate, force)
    row_id = add_recorded(state_store(), gpu, tier_name, rate, trainer=trainer_name, note=note)
    if as_json:
        emit_json({"id": row_id, "gpu": gpu, "tier": tier_name, "rate": rate, "trainer": trainer_name or None,
                   "note": note or None, "origin": "recorded"})
        return
    click.echo(f"recorded {rate:g}/s for {tier_name} on {gpu}" + (f" with {trainer_name}" if trainer_name else "")
               + "; sdcloud offers uses it for every host of that GPU")


def _forget(gpu: str | None, tier_name: str | None, trainer: str | None, observed: bool, row_id: int | None,
            as_json: bool = False) -> None:
    from ..speeds.records import RECORDED, forget

    if gpu is None and tier_name is None and trainer is None and row_id is None:
        raise UserError("say which figures to forget: --gpu, --tier, --trainer or --id (see: sdcloud speeds)")
    keys = dict(gpu=_gpu(gpu) if gpu else None, tier=_tier(tier_name) if tier_name else None,
                trainer=_trainer(trainer) if trainer else None, row_id=row_id)
    removed = forget(state_store(), origin=None if observed or row_id is not None else RECORDED, **keys)
    if not removed:
        raise UserError("no figure matches; see: sdcloud speeds")
    if as_json:
        return emit_json({"forgotten": removed})
    click.echo(f"forgot {removed} figure{'s' if removed != 1 else ''}")
