"""`sdcloud report RUN`: the run page (samples, charts, attempts, cost) as one offline HTML file, or JSON."""

from __future__ import annotations

import click

from ...errors import UserError
from ...render import output_options

FORMATS = ("html", "json")


@click.command()
@output_options
@click.argument("run")
@click.option("--format", "fmt", default="html", show_default=True, metavar="FORMAT", help="html or json.")
@click.option("--output", "-o", metavar="FILE", help="Write the page to this file instead of stdout.")
def report(run: str, fmt: str, output: str | None) -> None:
    """A run's or batch job's page: header, samples by checkpoint, charts with events, attempts, cost."""
    from ..cost import _check_output, write_output

    fmt = fmt.lower()
    if fmt not in FORMATS:
        raise UserError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    path = _check_output(output)
    from ...runs.records.state import StateStore
    from ...views.page import build
    from ...views.secrets import known, scrub

    state = StateStore()
    page = build(state, run)
    if fmt == "json":
        from ...views.sources import as_json

        text = as_json(page)
    else:
        from ...views.html import render

        text = render(page)
    text = scrub(text, known(state.get_run(run)["spec"]))
    write_output(text, path, output)
