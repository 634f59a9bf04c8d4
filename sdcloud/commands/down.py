"""`sdcloud down`: stop a run (or all of them); a batch job's stop is its cancel (verbs/stop.py, batch/jobs.py)."""

from __future__ import annotations

import click

from ..errors import UserError
from ..render import emit_json, output_options
from .common import complete_runs, find_run, state_store


@click.command()
@output_options
@click.argument("run", required=False, metavar="[RUN]", shell_complete=complete_runs)
@click.option("--all", "all_runs", is_flag=True, help="Every unfinished run.")
@click.option("--yes", is_flag=True, help="Do not ask before stopping every run (--all).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: each run and its state after the stop.")
def down(run: str | None, all_runs: bool, yes: bool, as_json: bool) -> None:
    """Stop a run (or all runs): the host saves a checkpoint and every instance is terminated."""
    from ..runs.records.state import ACTIVE_RUN_STATES

    if not run and not all_runs:
        raise UserError("name a run or pass --all; see: sdcloud status")
    state = state_store()
    runs = state.list_runs(ACTIVE_RUN_STATES) if all_runs else [find_run(state, run)]
    if all_runs and runs and not yes:
        click.confirm(f"Stop {len(runs)} run(s): {', '.join(r['id'] for r in runs)}?", abort=True, err=True)
    done: list[dict] = []
    failed: list[tuple[str, str]] = []  # (run, why): --all goes on to the other runs
    for r in runs:
        try:
            _stop_one(state, r, done)
        except UserError as exc:
            if not all_runs:
                raise
            failed.append((r["id"], str(exc)))
    if as_json:
        emit_json(done + [{"run": rid, "error": why} for rid, why in failed])
    else:
        for d in done:
            click.echo(_said(d, state.get_run(d["run"])))
    if failed:
        raise UserError(f"could not stop {len(failed)} run(s): " + "; ".join(f"{rid} ({why})" for rid, why in failed))


def _stop_one(state, r: dict, done: list[dict]) -> None:
    """Stop one run or batch job; what was done appended to `done`."""
    from ..offers.kinds import RunKind
    from ..runs.driving.background import controller_alive
    from ..runs.records.state import ACTIVE_RUN_STATES, run_kind
    from ..verbs.stop import stop_anywhere

    if run_kind(r) is RunKind.BATCH:
        # A batch job's stop is its cancel: final, its driver exits and starts no worker or host again.
        from ..batch.jobs import cancel as cancel_job, end_hosts

        if r["state"] in ACTIVE_RUN_STATES:
            cancel_job(r["id"], reason="cancelled by sdcloud down")
        end_hosts(r["id"])
        done.append({"run": r["id"], "state": state.get_run(r["id"])["state"]})
        return
    if r["state"] not in ACTIVE_RUN_STATES and not controller_alive(r):
        done.append({"run": r["id"], "state": r["state"], "already_ended": True})
        return
    out = stop_anywhere(state, r["id"], "stopped by sdcloud down")
    done.append({"run": r["id"], "state": out.state, **({"stop_requested_of": out.holder} if out.requested else {})})


def _said(d: dict, run: dict) -> str:
    """What `down` did to one run, in one line."""
    from ..runs.records.state import ACTIVE_RUN_STATES
    from ..verbs.stop_words import ended_line

    if d.get("already_ended"):  # nothing was stopped now: what ended it, and how to continue it
        said = ended_line(run) or f"run {d['run']}: {d['state']}"
        return f"run {d['run']} had already ended: " + said.removeprefix(f"run {d['run']}: ")
    holder = d.get("stop_requested_of")
    if not holder:
        from ..offers.kinds import RunKind
        from ..runs.records.state import run_kind

        if run_kind(run) is RunKind.BATCH:  # a cancel is final: what it made stays
            return f"batch job {d['run']}: {d['state']}; the images it made stay: sdcloud batch pull {d['run']}"
        return ended_line(run) or f"run {d['run']}: {d['state']}"
    if d["state"] not in ACTIVE_RUN_STATES:
        return f"{d['run']}: {d['state']} (by its driver on {holder}, through the run's bucket)"
    name = run.get("name") or run["id"]
    return (f"{d['run']}: stop requested; the driver on {holder} ends the host within one step "
            f"(follow it with: sdcloud watch {name})")
