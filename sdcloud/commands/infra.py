"""`sdcloud infra up|preview|down|outputs`: the cloud stacks through the Pulumi Automation API."""

from __future__ import annotations

import click

from ..providers.traits import has_stack
from ..render import emit_json, output_options
from .common import provider_choice

_provider = click.option("--provider", required=True, type=provider_choice(has_stack), help="Which cloud.")
_region = click.option("--region", required=True, metavar="REGION", help="Region, e.g. us-east-1 or ap-guangzhou.")


def _settings(f):
    """The stack settings shared by up and preview (defaults: config.toml [infra], then built-in)."""
    for opt in reversed([
        click.option("--ssh-cidr", metavar="CIDR",
                     help="The only network allowed to SSH in ('' for none; default: this machine's address /32)."),
        click.option("--public-key", metavar="KEY|FILE",
                     help="OpenSSH public key text or .pub file (default: ~/.ssh/id_ed25519.pub or id_rsa.pub)."),
        click.option("--prefix", metavar="PREFIX", help="Key prefix in the bucket; the host role may touch nothing outside it."),
        click.option("--root-volume-gb", type=click.IntRange(min=1), metavar="GB", help="Root disk size of a host, GB."),
        click.option("--checkpoint-expire-days", type=click.IntRange(min=0), metavar="DAYS",
                     help="Days after which checkpoints and logs expire (0: keep)."),
        click.option("--set", "extra", multiple=True, metavar="KEY=VALUE", help="Any other sdcloud:KEY stack setting."),
    ]):
        f = opt(f)
    return f


def _options(ssh_cidr, public_key, prefix, root_volume_gb, checkpoint_expire_days, extra):
    from ..errors import UserError
    from ..infra.automation import InfraOptions

    pairs = {}
    for item in extra:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set takes KEY=VALUE, got {item!r}")
        pairs[key.strip().removeprefix("sdcloud:")] = value
    return InfraOptions(prefix=prefix, ssh_cidr=ssh_cidr, public_key=public_key, root_volume_gb=root_volume_gb,
                        checkpoint_expire_days=checkpoint_expire_days, extra=pairs)


def _echo(line: str) -> None:
    click.echo(line.rstrip("\n"), err=True)


@click.group()
def infra() -> None:
    """Create, preview, destroy or show the cloud stacks (Pulumi; state under $SDCLOUD_HOME/pulumi)."""


@infra.command()
@output_options
@_provider
@_region
@_settings
@click.option("--json", "as_json", is_flag=True, help="Print the outputs as JSON.")
def up(provider, region, as_json, **settings) -> None:
    """Create or update the stack, and cache its outputs for `sdcloud up`."""
    from ..infra import automation as ops

    outputs = ops.up(provider, region, _options(**settings), on_output=None if as_json else _echo)
    _show(outputs, as_json)


@infra.command()
@output_options
@_provider
@_region
@_settings
@click.option("--json", "as_json", is_flag=True, help="Print the change counts as JSON.")
def preview(provider, region, as_json, **settings) -> None:
    """Show what `infra up` would change."""
    from ..infra import automation as ops

    changes = ops.preview(provider, region, _options(**settings), on_output=None if as_json else _echo)
    if as_json:
        emit_json(changes)
    else:
        click.echo(", ".join(f"{op}: {n}" for op, n in sorted(changes.items())) or "no changes")


@infra.command()
@output_options
@_provider
@_region
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def down(provider, region, yes) -> None:
    """Destroy the stack (the bucket must be empty unless forceDestroy was set)."""
    from ..infra import automation as ops

    ops.check_target(provider, region)
    ops.pulumi_root()  # a missing CLI is reported before the question
    if not yes:
        click.confirm(f"Destroy every sdcloud resource of {provider} in {region}, bucket included?", abort=True)
    ops.down(provider, region, on_output=_echo)
    click.echo(f"destroyed the {provider} stack in {region}")


@infra.command()
@output_options
@_provider
@_region
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def outputs(provider, region, as_json) -> None:
    """Show the stack outputs the providers launch from."""
    from ..infra import automation as ops

    _show(ops.outputs(provider, region), as_json)


def _show(values: dict, as_json: bool) -> None:
    if as_json:
        emit_json(values)
        return
    for key in sorted(values):
        value = values[key]
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or "-"
        click.echo(f"{key:22} {value}")
