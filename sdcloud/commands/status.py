"""`sdcloud status`: every run and batch job, or one's state, progress, attempts and host."""

from __future__ import annotations

import click

from ..errors import UserError
from ..offers.kinds import RunKind
from ..render import echo, emit_json, output_options, table, wide_option
from .common import complete_runs, find_run, state_store


def render_summary(summ: dict) -> None:
    from .. import render
    from ..events import one_line
    from ..verbs.stop_words import ended_line

    what = "batch job" if RunKind.of(summ) is RunKind.BATCH else "run"
    ended = ended_line(summ)  # a stopped or failed run: what happened, and the command that continues it
    # The reason in one line (a traceback's last line), once: the stop line says it where there is one.
    title = f"{what} {summ['run']} ({summ['tier']}): {summ['state']}" + (
        f" ({one_line(summ['reason'])})" if summ.get("reason") and not ended else "")
    if not summ["attempts"]:  # nothing launched (yet): no empty table
        echo(title)
    else:
        table(title, ["#", "provider", "region", "zone", "type", "market", "$/h", "hours", "cost $", "ended by"],
              [(a["n"], a["provider"], a["region"], a["zone"], a["instance_type"], a["market"],
                f"{a['price']:.4f}" if a["price"] is not None else "", f"{a['hours']:.3f}", f"{a['cost']:.4f}",
                a["end_reason"] or "running")
               for a in summ["attempts"]], drop=["provider", "region", "hours", "#"])
    c = summ["cost"]
    done = "images" if RunKind.of(summ) is RunKind.BATCH else "step"
    line = f"{done} {summ['step']}/{summ['total_steps']}; total ${c['total']:.4f}"
    if c.get("savings_pct") is not None:
        line += f"; on-demand would have cost ${c['ondemand_equivalent']:.4f} (saved {c['savings_pct']:.1f}%)"
    echo(line)
    from ..runs.records.nodes_view import node_hours_line

    if node_hours_line(summ):  # a multi-node run: each host's hours
        echo(node_hours_line(summ))
    if ended:
        echo(ended)
    if render.VERBOSITY > 0 and summ.get("reason") and "\n" in summ["reason"]:
        import click

        # The trainer's output, its traceback: -v only, as it was written (not re-wrapped).
        click.echo(f"the whole reason:\n{summ['reason']}")
    if summ.get("health"):
        from ..runs.driving.health_view import line as health_line

        echo(health_line(summ["health"]))
    if summ.get("nodes"):  # a multi-node run: each host's rank, phase and heartbeat
        from ..runs.records.nodes_view import node_lines

        for line in node_lines(summ["nodes"]):
            echo(line)
    best = summ.get("best_cloud_offer")
    if best:
        echo(f"the best cloud offer for this tier and job: {best['provider']} {best['region']} {best['instance_type']} "
             f"{best['market']} at ${best['price_per_hour_usd']:.4f}/h, about {best['est_hours']:.2f} h, ${best['est_cost']:.4f}")


def controller_note(run: dict, driver: dict | None = None) -> str | None:
    """For an unfinished run that no live controller drives: what to do about it (hosts may be billing).
    A run whose lease in its bucket another driver holds (`driver`, runs/summary.driver_of: another
    machine, a daemon, the cloud function) is driven: no note."""
    from ..offers.kinds import RunKind
    from ..runs.driving.background import controller_alive
    from ..runs.records.state import ACTIVE_RUN_STATES, run_kind

    if run["state"] not in ACTIVE_RUN_STATES or controller_alive(run) or (driver or {}).get("live"):
        return None
    name = run.get("name") or run["id"]
    if run_kind(run) is RunKind.BATCH:
        return (f"no controller: nothing drives batch job {run['id']}, and its hosts may still be billing; "
                f"drive it again with: sdcloud resume {name}; or cancel it with: sdcloud down {name}")
    return (f"no controller: nothing is watching run {run['id']}, and its host may still be billing; "
            f"resume it with: sdcloud resume {name}; or stop it with: sdcloud down {name}")


@click.command()
@output_options
@wide_option
@click.argument("run", required=False, metavar="[RUN]", shell_complete=complete_runs)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (a list of runs, or the one run).")
@click.option("--store", "store_url", metavar="URL",
              help="Read RUN's history from its bucket (s3://BUCKET/PREFIX, cos://..., file:///DIR): from any machine.")
def status(run: str | None, as_json: bool, store_url: str | None) -> None:
    """Show runs and batch jobs, or one's state, progress and attempts."""
    from ..runs.driving.background import controller_alive
    from ..runs.records.state import ACTIVE_RUN_STATES
    from ..runs.records.summary import driver_of, summary

    state = state_store()
    if store_url and not run:
        raise UserError("--store reads one run's history: name the run, e.g. sdcloud status RUN --store URL")
    from ..runs.records import journal

    seen_before = None
    if run and store_url:
        prior = state.get_run(run)
        seen_before = journal.seen(state, prior["id"]) if prior else None
        _restore_from_bucket(state, run, store_url)
    if run:
        from ..runs.records.store_of import refresh_reached

        found = find_run(state, run)
        seen_before = seen_before if store_url else journal.seen(state, found["id"])
        found = refresh_reached(state, found)  # the bucket's newer history: never this machine's stale view
        from ..verbs.self_ended import settle_self_ended

        if settle_self_ended(state, found):  # its host ended itself while nobody drove it
            found = state.get_run(found["id"])
        summ = summary(state, found["id"])
        summ["driver"] = driver_of(found)  # who holds its lease in the bucket (None: never taken, ended)
        record = journal.seen(state, found["id"])  # the bucket's record this view is (runs/records/journal.py)
        summ["record"] = record
        whose = _whose_record(record, seen_before)
        dead = controller_note(found, summ["driver"])
        summ["controller"] = "none" if dead else ("alive" if found["state"] in ACTIVE_RUN_STATES else "ended")
        host = _host_state(found)
        if host:
            summ["host"] = host
        from ..runs.records.nodes_view import read_nodes
        from ..runs.records.state import run_kind

        nodes = read_nodes(found) if run_kind(found) is RunKind.TRAIN else None
        if nodes:
            summ["nodes"] = nodes
        if as_json:
            emit_json(summ)
        else:
            render_summary(summ)
            if whose:
                echo(whose)
            if summ["driver"] and (summ["driver"]["live"] or dead):
                echo(summ["driver"]["line"])
            if dead:
                echo(dead)
            if host:
                echo(f"host: {host}")
        return
    runs = state.list_runs()
    summs = []
    for r in runs:
        s = summary(state, r["id"])
        # The bucket's lease, for a run no controller of this machine drives (another may).
        s["driver"] = None if controller_alive(r) else driver_of(r)
        s["controller"] = "none" if controller_note(r, s["driver"]) else "ok"
        summs.append(s)
    if as_json:
        emit_json(summs)
        return
    table("runs", ["run", "name", "tier", "provider", "state", "step", "attempts", "cost $"],
          [(r["run"], r["name"] or "", r["tier"], r["provider"],
            "no controller" if r["controller"] == "none" else r["state"], f"{r['step']}/{r['total_steps']}",
            len(r["attempts"]), f"{r['cost']['total']:.4f}") for r in summs],
          drop=["attempts", "provider", "name"], empty="no runs yet; start one with: sdcloud up --tier TIER "
                                                      "(the tiers: sdcloud tiers)")
    if any(r["controller"] == "none" for r in summs):
        echo("no controller: drive a run or batch job again with: sdcloud resume RUN; "
             "or stop it with: sdcloud down RUN")


def _whose_record(record: dict | None, before: dict | None) -> str | None:
    """One line when what is shown is a record another driver wrote to the bucket, read just now
    (this machine's own view was older): whose it is."""
    from ..runs.records.lease import Holder, describe

    if not record or not record.get("written_by") or (before and before.get("seq") == record.get("seq")):
        return None
    who = describe(Holder.of({"worker": record["written_by"]}, 0.0))
    return f"shown as the run's bucket records it (record {record['seq']}, written by {who})"


def _host_state(run: dict) -> str | None:
    """What the run's host says of itself beyond its phase: `unattended` (the controller's heartbeat
    is stale), or that it ended itself and why; None when it says neither or cannot be read."""
    import json as _json

    from ..offers.kinds import RunKind
    from ..runs.records.state import run_kind
    from ..runs.records.store_of import store_of

    if run_kind(run) is not RunKind.TRAIN:
        return None
    try:
        doc = _json.loads(store_of(run).get(f"runs/{run['id']}/status.json"))
    except Exception:  # noqa: BLE001 - no status yet, no store: nothing to add
        return None
    se = doc.get("self_end")
    if isinstance(se, dict):
        from ..verbs.stop_words import host_line

        return host_line(run, se)  # nothing when the run's own end says what happened
    return "unattended" if doc.get("unattended") else None


def _restore_from_bucket(state, run: str, url: str) -> None:
    """Rebuild RUN's rows here from the journal in its bucket (sdcloud.runs.records.journal); then every
    command (logs, watch, cost report, down, resume) works on this machine as on the one that started it."""
    from ..runs.records.store_of import open_checked, refresh, remember, url_conf

    conf = url_conf(url)  # opened with the credentials of its cloud (cos:// with the Tencent keys)
    found = state.get_run(run)
    rebuilt = refresh(state, open_checked(conf), found["id"] if found else run)
    if rebuilt is None:
        raise UserError(f"no run {run!r} in {url} (its journal is runs/{run}/journal/run.json); "
                        "name the run by its id there")
    remember(rebuilt["id"], conf)  # resume, down and watch --drive reach the run by this URL too
