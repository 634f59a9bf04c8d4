"""Options several commands share: the market flags, amounts of USD, the provider choices, and shell
completion of names a user types."""

from __future__ import annotations

import click

from ..errors import UserError

# Exit codes (docs/runs.md): 0 the run succeeded, 1 it stopped or failed, 2 bad input (nothing
# launched), 4 no controller is driving an unfinished run, 130 interrupted by Ctrl-C.
EXIT_NOT_SUCCEEDED = 1
EXIT_NO_CONTROLLER = 4
EXIT_INTERRUPTED = 130
# The training tiers, as `up --tier`'s help names them (without reading tiers.toml when the CLI
# loads; tests/cli/test_cli_help_texts.py holds it to the tiers file).
TRAIN_TIER_NAMES = ("sd15-lora", "sdxl-lora", "sd15-dreambooth", "sdxl-dreambooth", "sdxl-finetune",
                    "sd35m-lora", "sd35l-lora", "sd35m-dreambooth")
BATCH_TIER_NAMES = ("batch-sd15", "batch-sdxl", "batch-sd35")  # batch submit's, schedule add's


def state_store():
    from ..runs.records.state import StateStore

    return StateStore()


def find_run(state, run: str) -> dict:
    """The run (or batch job) `run` names, by id or name; one line that says where to look otherwise."""
    found = state.get_run(run)
    if found is None:
        raise UserError(f"no run {run!r}; see: sdcloud status")
    return found


def complete_tiers(ctx, param, incomplete: str):
    from ..offers.tiers import all_tiers

    return [t for t in all_tiers() if t.startswith(incomplete.lower())]


class ProvidersHelp(click.Option):
    """An option whose help names the providers of the registry (providers/traits.py) when it is shown:
    `{all}` every provider, `{catalog}` those with a price catalog, so that a provider added there is never
    missing from the help (and nothing is imported until help is asked for)."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        from ..providers.traits import has_catalog, names

        record = super().get_help_record(ctx)
        if record is None:
            return None
        return record[0], record[1].replace("{all}", ", ".join(names())).replace(
            "{catalog}", ", ".join(names(where=has_catalog)))


def complete_providers(ctx, param, incomplete: str):
    from ..providers.traits import names

    return [p for p in names() if p.startswith(incomplete.lower())]


def complete_regions(ctx, param, incomplete: str):
    from ..offers.catalog import load_catalog

    try:
        regions = sorted({r.region for r in load_catalog().rows})
    except Exception:  # completion must never print a traceback into the shell
        return []
    return [r for r in regions if r.startswith(incomplete)]


def complete_runs(ctx, param, incomplete: str):
    try:
        from ..runs.records.state import StateStore

        runs = StateStore().list_runs()
    except Exception:
        return []
    names = [r["id"] for r in runs] + [r["name"] for r in runs if r.get("name")]
    return [n for n in names if n.startswith(incomplete)]


def market_options(f):
    """--spot and --on-demand as two flags that exclude each other (passed on as `market`)."""
    def pick(ctx, param, value):
        return value

    f = click.option("--on-demand", "on_demand", is_flag=True, default=None, callback=pick,
                     help="On-demand capacity only.")(f)
    f = click.option("--spot", "spot", is_flag=True, default=None, callback=pick,
                     help="Spot capacity (the default), with on-demand to meet a deadline.")(f)
    return f


def sample_options(f):
    """`up`'s samples and tracker: --sample-prompt (repeatable), --sample-every, --sample-seed, --report-to."""
    for opt in reversed([
        click.option("--sample-prompt", "sample_prompt", multiple=True, metavar="PROMPT",
                     help="Render this prompt at the checkpoints (repeatable; fixed seeds): sdcloud samples RUN."),
        click.option("--sample-every", metavar="N", help="Samples at the checkpoints whose step is a multiple of N "
                     "(default: every checkpoint)."),
        click.option("--sample-seed", metavar="SEED", help="The first sample prompt's seed; prompt i uses SEED+i (default 0)."),
        click.option("--report-to", metavar="TRACKER", help="Also log the curves to wandb (key: config.toml [wandb] key); "
                     "TensorBoard files always go to the run's store.")]):
        f = opt(f)
    return f


def market_of(spot: bool | None, on_demand: bool | None) -> str | None:
    if spot and on_demand:
        raise UserError("--spot and --on-demand exclude each other: pass one of them")
    return "spot" if spot else "on-demand" if on_demand else None


class Usd(click.ParamType):
    """--max-price and --budget: a positive amount of USD, checked once by sdcloud.money.usd (a bad
    one is the usual one line and exit 2, before anything is read or launched)."""

    name = "usd"

    def __init__(self, per_hour: bool = False):
        self.per_hour = per_hour

    def convert(self, value, param, ctx):
        from ..money import usd

        return usd(value, param.opts[0] if param is not None else "amount", per_hour=self.per_hour)


USD = Usd()
USD_PER_HOUR = Usd(per_hour=True)


class _ProviderChoice(click.Choice):
    """A click.Choice whose choices are the providers registered when it is asked, not when the
    command was declared: a provider registered later (a copy of a folder) is a choice too."""

    def __init__(self, where=None) -> None:
        self._where = where
        super().__init__(())

    @property  # type: ignore[override]
    def choices(self):
        from ..providers.traits import names

        return names(where=self._where)

    @choices.setter
    def choices(self, value) -> None:  # click.Choice.__init__ sets it; the registry answers instead
        pass


def provider_choice(where=None) -> click.Choice:
    """The --provider choices: the providers' own declarations (sdcloud.providers.traits.names)."""
    return _ProviderChoice(where)
