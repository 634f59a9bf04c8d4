"""`sdcloud gc`: find and terminate hosts that sdcloud launched and no active run owns.

A host is a stray when its `sdcloud:run` tag names a run that is finished, or one this machine's
state does not know (a controller that died between the launch and the state write).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict

import click

from ..events import Kind
from ..render import emit_json, note, output_options, table, wide_option
from .common import provider_choice


def _row(inst) -> dict:
    d = asdict(inst)
    d["run_id"] = inst.run_id
    return d


@click.command()
@output_options
@wide_option
@click.option("--provider", required=True, type=provider_choice(),
              help="Where to search: a cloud, your SSH hosts, or this machine.")
@click.option("--region", "regions", multiple=True, metavar="REGION",
              help="Region to search (repeatable; default: the catalog's regions).")
@click.option("--yes", is_flag=True, help="Terminate without asking.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def gc(provider: str, regions: tuple[str, ...], yes: bool, as_json: bool) -> None:
    """Find and terminate hosts that sdcloud launched and no run owns."""
    from ..providers import get_provider
    from ..providers.capabilities import ReportsSearchErrors
    from ..runs.records.state import StateStore

    prov = get_provider(provider)
    found = prov.find_tagged(regions=list(regions) or None)
    errors = list(prov.last_errors or []) if isinstance(prov, ReportsSearchErrors) else []
    store = StateStore()
    try:
        strays = [i for i in found if not i.run_id or not store.run_is_active(i.run_id)]
        kept = [i for i in found if i not in strays]
        for err in errors:
            note(f"warning: {err}", wrap=True)
        if not as_json and strays:
            table(f"{provider}: {len(strays)} stray host(s) of {len(found)} tagged",
                  ["instance", "region", "zone", "type", "market", "state", "run", "attempt", "launched"],
                  [(i.id, i.region, i.zone, i.instance_type, i.market, i.state, i.run_id, i.tags.get("sdcloud:attempt"),
                    i.launched_at) for i in strays],
                  drop=["attempt", "market", "state", "zone", "region"])
        terminated: list[str] = []
        if strays and (yes or click.confirm(f"terminate {len(strays)} stray host(s)?", default=False, err=True)):
            by_region: dict[str, list] = defaultdict(list)
            for inst in strays:
                by_region[inst.region].append(inst)
            for region, insts in sorted(by_region.items()):
                prov.terminate([i.id for i in insts], region=region)
                for i in insts:
                    terminated.append(i.id)
                    store.event(i.run_id, Kind.GC_TERMINATED, {"provider": provider, "instance_id": i.id, "region": region})
        elif strays:
            note("nothing terminated (not confirmed)")
        dropped = _drop_left_secrets(store, provider)
        if dropped:
            note(f"deleted the secrets {dropped} ended run(s) had left in their buckets")
        from ..providers.groups import SweepsGroupLeftovers

        if isinstance(prov, SweepsGroupLeftovers):  # free leftovers of multi-node groups (placement groups)
            for name in prov.sweep_group_leftovers(list(regions) or None, store.run_is_active):
                note(f"deleted {name}, left by a run that is over")
    finally:
        store.close()
    if as_json:
        emit_json({"provider": provider, "found": len(found), "strays": [_row(i) for i in strays],
                   "kept": [_row(i) for i in kept], "terminated": terminated, "errors": errors})
    elif terminated:
        note(f"terminated {len(terminated)} host(s): {', '.join(terminated)}")
    elif not strays:
        note(f"{provider}: no stray hosts" + (f" ({len(found)} tagged, each owned by a live run)" if found else ""))


def _drop_left_secrets(state, provider: str) -> int:
    """A secret ends with its run (runs/inputs/hub_access.py): one an ended run of `provider` left in
    its bucket (its end could not reach the store) is deleted here. How many runs had one."""
    from ..offers.kinds import RunKind
    from ..runs.inputs import hub_access
    from ..runs.records.state import FINAL_RUN_STATES, run_kind
    from ..runs.records.store_of import store_of

    n = 0
    for run in state.list_runs(FINAL_RUN_STATES):
        if run_kind(run) is not RunKind.TRAIN or (run["spec"] or {}).get("provider") != provider:
            continue
        try:
            n += hub_access.drop(store_of(run), run["id"]) > 0
        except Exception:  # noqa: BLE001 - a bucket this machine cannot reach now: the next gc
            continue
    return n

