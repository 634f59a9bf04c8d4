"""`sdcloud pull RUN [DIR]`: download a run's finished model."""

from __future__ import annotations

from pathlib import Path

import click

from ..render import emit_json


@click.command()
@click.argument("run")
@click.argument("dest", required=False)
@click.option("--json", "as_json", is_flag=True)
def pull(run: str, dest: str | None, as_json: bool) -> None:
    """Download a run's artifacts (the LoRA files, README) into DIR (default: ./RUN)."""
    from ..errors import UserError
    from ..runs.artifacts import pull as pull_artifacts
    from ..runs.state import StateStore

    found = StateStore().get_run(run)
    if found is None:
        raise UserError(f"no run {run!r}; see: sdcloud status")
    folder = Path(dest or found["id"])
    files = pull_artifacts(found, folder)
    if as_json:
        emit_json({"run": found["id"], "dir": str(folder.resolve()), "files": [str(f) for f in files]})
        return
    for f in files:
        click.echo(str(f))
    click.echo(f"{len(files)} file(s) of run {found['id']} in {folder}")
