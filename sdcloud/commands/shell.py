"""`sdcloud ssh`: a shell on a run's current host (the provider's own argv where it has one)."""

from __future__ import annotations

import os

import click

from ..errors import UserError
from ..render import output_options
from .common import complete_runs, find_run, state_store


@click.command()
@output_options
@click.argument("run", metavar="RUN", shell_complete=complete_runs)
def ssh(run: str) -> None:
    """Open a shell on a run's current host."""
    from ..providers import get_provider
    from ..providers.capabilities import HasHostDir, HasShell
    from ..providers.traits import Hosts, traits
    from ..runs.driving.controller import Controller

    state = state_store()
    found = find_run(state, run)
    live = [a for a in state.attempts(found["id"]) if a.state != "ended" and a.instance_id]
    if not live:
        raise UserError(f"run {found['id']} has no running host")
    a = live[-1]
    if traits(a.provider).hosts is Hosts.THIS_MACHINE:
        prov = get_provider(a.provider)
        host_dir = prov.host_dir(a.instance_id) if isinstance(prov, HasHostDir) else None
        click.echo(f"the {a.provider} provider's host is this machine; its working folder is {host_dir}")
        return
    ctl = Controller(state, found["id"])
    inst = next(iter(ctl.provider.describe([a.instance_id], region=a.region)), None)
    if inst is None or not inst.live:
        raise UserError(f"instance {a.instance_id} is not running")
    if isinstance(ctl.provider, HasShell):
        argv = list(ctl.provider.ssh_argv(inst))
    else:
        target = inst.public_ip or inst.private_ip
        if not target:
            raise UserError(f"instance {a.instance_id} has no reachable address")
        argv = ["ssh", f"{os.environ.get('SDCLOUD_SSH_USER', 'ubuntu')}@{target}"]
    os.execvp(argv[0], argv)
