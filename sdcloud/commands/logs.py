"""`sdcloud logs`: a run's controller events and its hosts' logs, merged in time order (verbs/logs.py)."""

from __future__ import annotations

import time

import click

from .. import render
from ..errors import UserError
from ..render import output_options
from .common import complete_runs, find_run, state_store


@click.command()
@output_options
@click.argument("run", metavar="RUN", shell_complete=complete_runs)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the run ends.")
@click.option("--tail", "tail_n", type=int, metavar="N", help="Only the last N lines.")
@click.option("--attempt", type=int, metavar="N", help="Only attempt N (and the controller's events about it).")
@click.option("--steps", is_flag=True, help="Include the trainer's per-step lines.")
@click.option("--json", "as_json", is_flag=True, help="One JSON record per line: time, source, attempt, kind, text.")
@click.option("--node", type=click.IntRange(min=0), metavar="K",
              help="One host of a multi-node run: its log alone (0 is rank 0).")
def logs(run: str, follow: bool, tail_n: int | None, attempt: int | None, steps: bool, as_json: bool,
         node: int | None) -> None:
    """Print (or follow) a run's log: controller events and the hosts' logs, merged in time order.

    The trainer's protocol lines read in plain words (checkpoint step 500 saved); libraries'
    warnings and notes are left out; -v shows all as the host wrote them."""
    import json as _json

    from ..events import RUN_ENDED, parse
    from ..verbs.logs import log_line, log_records
    from ..runs.records.state import FINAL_RUN_STATES

    if tail_n is not None and tail_n < 0:
        raise UserError(f"--tail must be 0 or more, got {tail_n}")
    state = state_store()
    found = find_run(state, run)
    if attempt is not None:
        _check_attempt(state, found, attempt, follow)
    from ..offers.groups import node_count

    nodes = node_count(found.get("spec") or {})
    if node is not None and node >= nodes:
        raise UserError(f"--node {node}: {found['id']} runs on {nodes} host{'s' if nodes > 1 else ''} "
                        f"(nodes 0 to {nodes - 1})")
    offsets: dict = {}

    def show(records: list[dict], first: bool) -> None:
        if attempt is not None:
            # Attempt N's lines, and of the controller's events those about it and the run's end.
            records = [r for r in records if r["attempt"] == attempt or r["attempt"] is None and
                       r["source"] == "controller" and parse(r["kind"]) in RUN_ENDED]
        if render.VERBOSITY <= 0:
            # Libraries' warnings and notes and protocol lines without words are noise to a user:
            # -v shows them.
            records = [r for r in records if not r.get("verbose_only")]
        if first and tail_n is not None:
            records = records[-tail_n:] if tail_n else []
        for r in records:
            click.echo(_json.dumps(r) if as_json else log_line(r))

    show(log_records(state, found, offsets, steps, node), True)
    while follow and state.get_run(found["id"])["state"] not in FINAL_RUN_STATES:
        time.sleep(2)
        show(log_records(state, found, offsets, steps, node), False)
    if follow:
        show(log_records(state, found, offsets, steps, node), False)


def _check_attempt(state, run: dict, attempt: int, follow: bool) -> None:
    """--attempt N names an attempt the run has had (following an unfinished run: or its next one)."""
    from ..runs.records.state import FINAL_RUN_STATES

    # The attempts recorded here, and those the run's events name (a run read from its bucket).
    seen = [a.n for a in state.attempts(run["id"])]
    seen += [int(ev["data"]["attempt"]) for ev in state.events(run["id"])
             if isinstance(ev["data"].get("attempt"), int)]
    last = max(seen, default=0)
    upto = last + 1 if follow and run["state"] not in FINAL_RUN_STATES else last
    if not 1 <= attempt <= upto:
        had = f"attempts 1 to {last}" if last > 1 else "attempt 1 only" if last == 1 else "no attempt yet"
        raise UserError(f"--attempt {attempt}: {run['id']} has had {had}"
                        + (" (with -f, the next one too)" if upto > last else ""))

