"""`sdcloud watch`: follow a run until it ends (verbs/progress_view.py), or take it and drive it here (--drive)."""

from __future__ import annotations

import time

import click

from ..errors import UserError
from ..events import Kind
from ..render import output_options
from ..runs.records.run_state import RunState
from .common import EXIT_INTERRUPTED, EXIT_NO_CONTROLLER, EXIT_NOT_SUCCEEDED, complete_runs, find_run, state_store


@click.command()
@output_options
@click.argument("run", metavar="RUN", shell_complete=complete_runs)
@click.option("--interval", type=click.FloatRange(min=0, min_open=True), default=2.0, show_default=True, metavar="SECONDS",
              help="How often to look.")
@click.option("--drive", "take_over", is_flag=True,
              help="Take the run from whichever driver holds it (the cloud driver, another machine) and drive it here.")
def watch(run: str, interval: float, take_over: bool) -> None:
    """Follow a run's progress until it ends; exit with the run's own exit code. Ctrl-C under --drive
    hands the run back to the cloud driver or a background controller; it does not stop it."""
    from ..offers.kinds import RunKind
    from ..runs.records.state import FINAL_RUN_STATES, run_kind
    from ..runs.records.summary import summary
    from ..verbs.progress_view import ProgressView
    from .status import controller_note, render_summary

    state = state_store()
    found = find_run(state, run)
    if take_over:
        if run_kind(found) is not RunKind.TRAIN:
            raise UserError(f"{found['id']} is a batch job; --drive takes training runs")
        from ..runs.records.store_of import refresh, store_of
        from .run import drive

        # The run's own bucket (the URL this machine reached it by): its history is newer than this machine's.
        refresh(state, store_of(found), found["id"])
        found = state.get_run(found["id"])
        if found["state"] in FINAL_RUN_STATES:
            raise UserError(f"run {found['id']} has ended ({found['state']}); nothing to drive")
        # Ctrl-C gives the run back (to the cloud driver or a background controller): it does not stop it.
        drive(state, found["id"], False, False, take_over=True, hand_back=True)
        return
    from ..runs.records.store_of import refresh_reached
    from ..verbs.self_ended import settle_self_ended

    found = refresh_reached(state, found)  # a run reached by its bucket's URL: what its driver wrote since
    if settle_self_ended(state, found):  # its host ended itself while nobody drove it: shown as it is
        found = state.get_run(found["id"])
    view = ProgressView(found["total_steps"], quiet=False)
    offsets: dict = {}
    # A controller that was just started writes its pid at once; give it a moment before judging.
    grace_until = time.time() + 2 * interval
    elsewhere: dict = {"at": 0.0, "driver": None, "said": None}  # a driver of another machine (its lease)
    try:
        while True:
            r = state.get_run(found["id"])
            for ev in state.events(found["id"], after_id=offsets.get("events", 0)):
                offsets["events"] = ev["id"]
                view(ev["kind"], ev["data"], at=ev["time"])
            summ = summary(state, r["id"])
            _show_nodes(r, elsewhere)
            view(Kind.PROGRESS, {"step": r["step"], "phase": r["state"], "cost": summ["cost"]["total"],
                                 "total": r["total_steps"]})
            if r["state"] in FINAL_RUN_STATES:
                break
            driver = _elsewhere(state, r, elsewhere)
            dead = controller_note(r, driver)
            if dead and time.time() > grace_until:
                view.close()
                click.echo(dead, err=True)
                raise SystemExit(EXIT_NO_CONTROLLER)
            time.sleep(interval)
    except KeyboardInterrupt:
        view.close()
        name = found.get("name") or found["id"]
        click.echo(f"stopped watching; run {found['id']} continues (sdcloud watch {name} to follow it again, "
                   f"sdcloud down {name} to stop it)", err=True)
        raise SystemExit(EXIT_INTERRUPTED)
    finally:
        view.close()
    summ = summary(state, found["id"])
    render_summary(summ)
    if summ["state"] != RunState.SUCCEEDED:
        raise SystemExit(EXIT_NOT_SUCCEEDED)


def _show_nodes(run: dict, seen: dict) -> None:
    """A multi-node run: each host's line when its phase or health changes (runs/records/nodes_view.py)."""
    from ..runs.records.nodes_view import node_count, node_lines, read_nodes

    if node_count(run) <= 1:
        return
    nodes = read_nodes(run) or []
    for n, line in zip(nodes, node_lines(nodes)):
        said = (n["attempt"], n["phase"], n["health"])
        if seen.get(("node", n["node"])) != said:
            seen[("node", n["node"])] = said
            click.echo(line, err=True)


# How often `watch` reads the lease and the journal of a run that another machine or the cloud drives.
ELSEWHERE_SECONDS = 10.0


def _elsewhere(state, run: dict, seen: dict) -> dict | None:
    """Who drives `run` when no controller of this machine does (runs/summary.driver_of), said once
    when it changes; while that driver is live, this machine's copy follows the bucket's journal."""
    from ..runs.driving.background import controller_alive
    from ..runs.records.summary import driver_of

    if controller_alive(run):
        return None
    if time.time() - seen["at"] >= ELSEWHERE_SECONDS:
        seen["at"] = time.time()
        seen["driver"] = driver_of(run)
        driver = seen["driver"]
        if driver and driver["live"] and driver["worker"] != seen["said"]:  # a new holder: said once
            click.echo(driver["line"], err=True)
            seen["said"] = driver["worker"]
        if driver and driver["live"]:
            from ..runs.records.store_of import refresh, store_of

            try:
                refresh(state, store_of(run), run["id"])  # that driver writes the run's history there
            except Exception:  # noqa: BLE001 - a bucket that cannot be read now is read at the next look
                pass
    return seen["driver"]
