"""`sdcloud pull RUN [DIR]`: download a run's finished model."""

from __future__ import annotations

from pathlib import Path

import click

from ..render import emit_json, output_options


@click.command()
@output_options
@click.argument("run", metavar="RUN")
@click.argument("dest", required=False, metavar="[DIR]")
@click.option("--force", is_flag=True, help="Write into a folder that holds other files (same names are replaced).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the files fetched and where.")
def pull(run: str, dest: str | None, force: bool, as_json: bool) -> None:
    """Download a run's artifacts (the LoRA files, README) into DIR (default: ./RUN).

    DIR must be new, empty, or an earlier pull of the same run (then only what is missing is fetched);
    --force writes into any folder."""
    from ..errors import UserError
    from ..offers.kinds import RunKind
    from ..runs.records.artifacts import pull as pull_artifacts
    from ..runs.records.state import StateStore, run_kind

    found = StateStore().get_run(run)
    if found is None:
        raise UserError(f"no run {run!r}; see: sdcloud status")
    if run_kind(found) is RunKind.BATCH:  # one command for both kinds: a batch job's pull is its images
        from ..batch import jobs

        res = jobs.pull(found["id"], dest, force=force)
        if as_json:
            emit_json(res)
        else:
            click.echo(f"{res['images']} image(s) of batch job {found['id']} in {res['dir']} (gallery: {res['gallery']})")
        return
    from ..runs.records import pulls

    folder = Path(dest or found["id"]).expanduser()
    pulls.check_destination(StateStore(), found["id"], folder, force, f"run {found['id']}")
    files = pull_artifacts(found, folder)
    pulls.record(StateStore(), found["id"], folder)
    if as_json:
        emit_json({"run": found["id"], "dir": str(folder.resolve()), "files": [str(f) for f in files]})
        return
    for f in files:
        click.echo(str(f))
    click.echo(f"{len(files)} file(s) of run {found['id']} in {folder}")
