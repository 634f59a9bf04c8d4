"""The `sdcloud` command line: a root group whose subcommands load lazily.

Each subcommand lives in sdcloud/commands/<module>.py and only parses, calls one function of the
control plane and renders the result. Loading them lazily keeps `sdcloud --help` instant: no
boto3, pulumi or torch import at start-up.
"""

from __future__ import annotations

import importlib
import sqlite3
import sys

import click

from . import __version__
from .errors import UserError

# name -> (module under sdcloud.commands, attribute, one-line help shown by --help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "up": ("run", "up", "Run a training job: pick the offer, launch, survive reclaims, report the cost."),
    "resume": ("run", "resume", "Continue a stopped or failed run from its durable checkpoint."),
    "config": ("config", "config", "Show the settings in effect and where they come from."),
    "status": ("status", "status", "Show runs, or one run's state, step and attempts."),
    "logs": ("logs", "logs", "Print (or follow) a run's log."),
    "down": ("down", "down", "Stop a run (or all runs) and terminate its hosts."),
    "watch": ("watch", "watch", "Follow a run's progress."),
    "ssh": ("shell", "ssh", "Open a shell on a run's current host."),
    "pull": ("pull", "pull", "Download a run's finished model (its artifacts) to a folder."),
    "samples": ("pull", "samples", "List a run's sample images per checkpoint, or download them."),
    "tiers": ("offers", "tiers", "List the workload tiers and what each needs."),
    "offers": ("offers", "offers", "Rank GPU offers by the expected cost to finish a job."),
    "catalog": ("catalog", "catalog", "Refresh or show the GPU offer catalog."),
    "speeds": ("speeds", "speeds", "List, record or forget the rates runs measured, beside the catalog's."),
    "report": ("pages.report", "report",
               "A run's page: samples by checkpoint, charts with events, attempts, cost (HTML or JSON)."),
    "dashboard": ("pages.dashboard", "dashboard", "Serve this home's runs and batch jobs as live pages on 127.0.0.1."),
    "cost": ("cost", "cost", "Cost reports per run (table, JSON, CSV, HTML) and reconciliation with the bill."),
    "gc": ("gc", "gc", "Find and terminate hosts that sdcloud launched and no run owns."),
    "infra": ("infra", "infra", "Create, preview, destroy or show the cloud stacks (Pulumi)."),
    "simulate": ("simulate", "simulate", "Replay spot availability traces through the spot policies."),
    "batch": ("batch", "batch", "Batch image generation over K spot workers: submit, status, pull, verify, schedule."),
    "scheduler": ("batch", "scheduler", "Run due batch schedules, or install a timer that does."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module_name, attr, _ = entry
        module = importlib.import_module(f"sdcloud.commands.{module_name}")
        return getattr(module, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Short help comes from the registry so that --help imports no command module.
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sdcloud")
def root() -> None:
    """sdcloud: Stable Diffusion training and batch generation on cloud GPUs, for the least money."""


def _one_line(message: str) -> str:
    """click lays some messages over several lines (a missing option's choices, one a line, tab-indented)."""
    return " ".join(message.split())


def _shown(message: str) -> str:
    """An error as it may be printed: no secret it quotes (config.redact), no control character a
    user typed (a name's ESC [2J would clear the screen), on one line."""
    from .config import redact
    from .names import strip_controls

    return strip_controls(redact(message))


def main(argv: list[str] | None = None) -> int:
    """Entry point: every error is one line on stderr and a non-zero exit code."""
    from . import render

    render.VERBOSITY = 0  # each command starts at normal detail: -q/-v apply to the one they are given to
    try:
        root.main(args=argv, prog_name="sdcloud", standalone_mode=False)
    except UserError as exc:
        click.echo(f"error: {_shown(str(exc))}", err=True)
        return exc.exit_code
    except click.exceptions.Abort as exc:
        # click turns a Ctrl-C (in a prompt, or before a command's own handler) into Abort: still 130.
        if isinstance(exc.__cause__ or exc.__context__, KeyboardInterrupt):
            click.echo("interrupted", err=True)
            return 130
        click.echo("aborted", err=True)
        return 1
    except click.exceptions.NoArgsIsHelpError as exc:
        # `sdcloud` or a group (`sdcloud batch`) given no command: a request for its help, not an error.
        if exc.ctx is None:
            raise
        click.echo(exc.ctx.get_help())
        return 0
    except click.UsageError as exc:
        sub = exc.ctx.command_path.split(" ", 1)[1] if exc.ctx and " " in exc.ctx.command_path else ""
        hint = f" (see: sdcloud {sub} --help)"
        click.echo(f"error: {_shown(_one_line(exc.format_message()))}{hint.replace('sdcloud  --help', 'sdcloud --help')}",
                   err=True)
        return 2
    except click.ClickException as exc:
        click.echo(f"error: {_shown(_one_line(exc.format_message()))}", err=True)
        return exc.exit_code
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc):
            raise
        from .runs.records.db_lock import locked_message

        click.echo(f"error: {locked_message()}", err=True)  # another sdcloud holds state.db past the wait
        return 2
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except click.exceptions.Exit as exc:
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
