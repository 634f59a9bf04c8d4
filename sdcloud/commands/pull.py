"""`sdcloud pull RUN [DIR]`: download a run's finished model, or the model at one checkpoint (`--step N`,
`--list`); `sdcloud samples RUN`: the sample images the run rendered at its checkpoints."""

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
@click.option("--step", type=click.IntRange(min=1), metavar="N", help="The model at checkpoint N instead of the final one.")
@click.option("--list", "list_only", is_flag=True, help="List the kept checkpoints, their steps and samples; fetch nothing.")
def pull(run: str, dest: str | None, force: bool, as_json: bool, step: int | None, list_only: bool) -> None:
    """Download a run's artifacts (the LoRA files, README) into DIR (default: ./RUN).

    DIR must be new, empty, or an earlier pull of the same run (then only what is missing is fetched);
    --force writes into any folder. --step N: the model at checkpoint N (see them with --list)."""
    from ..errors import UserError
    from ..offers.kinds import RunKind
    from ..runs.records.artifacts import pull as pull_artifacts
    from ..runs.records.state import StateStore, run_kind

    found = StateStore().get_run(run)
    if found is None:
        raise UserError(f"no run {run!r}; see: sdcloud status")
    if run_kind(found) is RunKind.BATCH:  # one command for both kinds: a batch job's pull is its images
        from ..batch import jobs

        if step is not None or list_only:
            raise UserError(f"{found['id']} is a batch job: --step and --list pick a training run's checkpoint")
        res = jobs.pull(found["id"], dest, force=force)
        if as_json:
            emit_json(res)
        else:
            click.echo(f"{res['images']} image(s) of batch job {found['id']} in {res['dir']} (gallery: {res['gallery']})")
        return
    from ..runs.records import artifacts, pulls

    if list_only:
        if dest or step is not None:
            raise UserError("pull --list fetches nothing: give it no DIR and no --step")
        return _list(found, as_json)
    folder = Path(dest or (found["id"] if step is None else f"{found['id']}-step{step}")).expanduser()
    pulls.check_destination(StateStore(), found["id"], folder, force, f"run {found['id']}")
    files = pull_artifacts(found, folder) if step is None else artifacts.pull_step(found, folder, step)
    pulls.record(StateStore(), found["id"], folder)
    if as_json:
        emit_json({"run": found["id"], "dir": str(folder.resolve()), "files": [str(f) for f in files]})
        return
    for f in files:
        click.echo(str(f))
    click.echo(f"{len(files)} file(s) of run {found['id']} in {folder}")


def _list(found: dict, as_json: bool) -> None:
    from ..errors import UserError
    from ..render import table
    from ..runs.records import artifacts
    from ..runs.records.store import StoreError

    try:
        kept = artifacts.kept_checkpoints(artifacts.run_store(found), found["id"])
    except StoreError as exc:
        raise UserError(f"cannot list the checkpoints of run {found['id']}: {exc}") from None
    if as_json:
        emit_json({"run": found["id"], "checkpoints": kept})
        return
    if not kept:
        click.echo(f"run {found['id']} has no complete checkpoint in its store")
        return
    table(None, ["STEP", "MB", "MODEL", "SAMPLES"],
                [[str(c["step"]), f"{c['bytes'] / 1e6:.1f}", "yes" if c["model_files"] else "no",
                  f"{len(c['samples'])} (sdcloud samples {found['id']} --step {c['step']})" if c["samples"] else "-"]
                 for c in kept])


@click.command()
@output_options
@click.argument("run", metavar="RUN")
@click.option("--step", type=click.IntRange(min=1), metavar="N", help="Only the samples of checkpoint N.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: each sample's step, index, prompt, seed, sampler, key.")
@click.option("-o", "--output", "dest", metavar="DIR", help="Download them to DIR/<step>/<NN>.png (with their JSON).")
def samples(run: str, step: int | None, as_json: bool, dest: str | None) -> None:
    """List a run's sample images (prompts x checkpoints), or download them with -o DIR."""
    from ..errors import UserError
    from ..render import table
    from ..runs.records import artifacts
    from ..runs.records import samples as records
    from ..runs.records.state import StateStore
    from ..runs.records.store import StoreError

    found = StateStore().get_run(run)
    if found is None:
        raise UserError(f"no run {run!r}; see: sdcloud status")
    try:
        store = artifacts.run_store(found)
        got = records.list_samples(store, found["id"], step)
    except StoreError as exc:
        raise UserError(f"cannot list the samples of run {found['id']}: {exc}") from None
    url = artifacts.location(found).rsplit("/artifacts/", 1)[0]
    files = records.download(got, Path(dest).expanduser()) if dest else []
    if as_json:
        emit_json({"run": found["id"], "samples": [{**s.as_dict(), "url": f"{url}/{s.key.split('/', 2)[2]}"} for s in got],
                   **({"dir": str(Path(dest).expanduser().resolve()), "files": [str(f) for f in files]} if dest else {})})
        return
    table(None, ["STEP", "#", "SEED", "PROMPT", "FILE" if dest else "KEY"],
          [[str(s.step), str(s.index), "" if s.seed is None else str(s.seed), s.prompt,
            str(f) if dest else s.key] for s, f in zip(got, files or [None] * len(got))],
          wrap=["PROMPT"], fold=["FILE", "KEY"],
          empty=f"run {found['id']} has no samples{'' if step is None else f' at step {step}'} "
                "(ask for them with up --sample-prompt TEXT)")
