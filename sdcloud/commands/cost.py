"""`sdcloud cost report` and `sdcloud cost reconcile`: what runs cost, and what the bill says."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..errors import UserError
from ..offers.kinds import RunKind
from ..render import emit_json, output_options, wide_option


def _since_seconds(since: str | None) -> float | None:
    if since is None:
        return None
    from ..runs.inputs.spec import parse_duration

    return parse_duration(since, "--since") * 3600.0


def _check_output(output: str | None) -> Path | None:
    """Refuse an output path that cannot be written before any work is done."""
    if output is None:
        return None
    path = Path(output).expanduser()
    if path.is_dir():
        raise UserError(f"--output {output}: is a folder")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"--output {output}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UserError(f"--output {output}: not writable")
    return path


def write_output(text: str, path: Path | None, output: str | None) -> None:
    """A report to stdout, or to the file `--output` named (checked by _check_output), said in one line."""
    if path is None:
        click.echo(text, nl=False)
        return
    try:
        path.write_text(text)
    except OSError as exc:
        raise UserError(f"--output {output}: {exc.strerror or exc}") from None
    click.echo(f"wrote {path}", err=True)


@click.group()
def cost() -> None:
    """Cost reports per run, and reconciliation with the cloud's bill."""


@cost.command()
@output_options
@wide_option
@click.argument("runs", nargs=-1)
@click.option("--since", metavar="DURATION", help="Runs created or active within this long, e.g. 7d, 36h.")
@click.option("--all", "all_runs", is_flag=True, help="Every run in the state store.")
@click.option("--format", "fmt", default="table", show_default=True, metavar="FORMAT", help="table, json, csv or html.")
@click.option("--output", "-o", metavar="FILE", help="Write the report to this file instead of stdout.")
@click.option("--by", metavar="FIELD", help="Add a summary by tier, provider or day.")
def report(runs: tuple[str, ...], since: str | None, all_runs: bool, fmt: str, output: str | None, by: str | None) -> None:
    """What each run and attempt cost: compute, disks, bucket, requests, egress, time lost, savings."""
    from ..costs.report import FORMATS, GROUPINGS, build_report, select_runs, to_csv

    fmt = fmt.lower()
    if fmt not in FORMATS:
        raise UserError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if by is not None and by not in GROUPINGS:
        raise UserError(f"--by must be one of {', '.join(GROUPINGS)}, got {by!r}")
    if runs and (since or all_runs):
        raise UserError("name runs, or pass --since or --all, not both")
    seconds = _since_seconds(since)
    path = _check_output(output)
    if fmt == "table" and path is not None:
        raise UserError("--output needs --format json, csv or html")
    from ..batch.status import images_done
    from ..runs.records.state import StateStore

    state = StateStore()
    chosen = select_runs(state, runs, seconds, all_runs or (not runs and seconds is None))
    # A batch job's images so far, from its bucket, as `batch status` counts them: the same figures.
    images = {r["id"]: images_done(r) for r in chosen if RunKind.of(r.get("spec")) is RunKind.BATCH}
    rep = build_report(state, chosen, by=by, images=images)
    if fmt == "table":
        from ..costs.report import print_tables

        print_tables(rep)
        return
    if fmt == "json":
        import json

        text = json.dumps(rep, indent=2, default=str) + "\n"
    elif fmt == "csv":
        text = to_csv(rep)
    else:
        from ..costs.html import render_html

        text = render_html(rep)
    write_output(text, path, output)


@cost.command()
@output_options
@wide_option
@click.option("--since", default="30d", show_default=True, metavar="DURATION", help="Runs created or active within this long.")
@click.option("--threshold", default="10", show_default=True, metavar="PERCENT",
              help="Flag runs whose bill differs by more than this percent.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def reconcile(since: str, threshold: str, as_json: bool) -> None:
    """Fetch the billed amount of each run (AWS Cost Explorer, Tencent DescribeBillDetail) and compare."""
    from ..costs.reconcile import reconcile as do_reconcile
    from ..render import table

    seconds = _since_seconds(since)
    try:
        pct = float(threshold)
    except ValueError:
        raise UserError(f"--threshold must be a percentage, got {threshold!r}") from None
    if not pct >= 0:
        raise UserError(f"--threshold must be a percentage, got {threshold!r}")
    from ..runs.records.state import StateStore

    rows = do_reconcile(StateStore(), since_seconds=seconds, threshold_pct=pct)
    if as_json:
        emit_json(rows)
        return
    table("estimate against the bill", ["run", "provider", "estimate $", "billed $", "difference $", "difference %", "flag"],
          [(r["run"], r["provider"], f"{r['estimate_usd']:.4f}", "" if r["billed_usd"] is None else f"{r['billed_usd']:.4f}",
            "" if r["difference_usd"] is None else f"{r['difference_usd']:.4f}",
            "" if r["difference_pct"] is None else f"{r['difference_pct']:.1f}", r["flag"] or "") for r in rows],
          drop=["provider", "difference $"])
