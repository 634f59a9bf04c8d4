"""`sdcloud dashboard`: this home's runs and batch jobs as live pages, on 127.0.0.1."""

from __future__ import annotations

import click

from ...render import output_options

DEFAULT_PORT = 8765


@click.command()
@output_options
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=int, metavar="PORT", help="Port to listen on.")
@click.option("--host", default="127.0.0.1", show_default=True, metavar="ADDRESS",
              help="Address to listen on; anything but loopback needs --token.")
@click.option("--token", envvar="SDCLOUD_DASHBOARD_TOKEN", metavar="TOKEN",
              help="Every request must carry it (?token= once, then a cookie; or Authorization: Bearer).")
@click.option("--store", "stores", multiple=True, metavar="URL",
              help="Also show the runs in this bucket: s3://, cos:// or file:// (repeatable).")
def dashboard(port: int, host: str, token: str | None, stores: tuple[str, ...]) -> None:
    """Serve the list of jobs and each job's page (samples, charts, cost), updated as they land."""
    from ...dashboard.serve import serve

    serve(host, port, token, stores, say=lambda line: click.echo(line, err=True))
