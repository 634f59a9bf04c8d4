"""Help texts that say what the code does (issue 46): every `--json` says what it prints, an optional
argument is shown in brackets, every command has -q/-v, the batch commands name every batch tier,
and each `--store` names every bucket scheme a run takes (cos:// included)."""

from __future__ import annotations

import click

from tests.cli.test_cli_conventions import _every_command


def test_every_json_flag_has_help():
    missing = [" ".join(path) for path, cmd, _ in _every_command()
               for p in cmd.params if isinstance(p, click.Option) and "--json" in p.opts and not p.help]
    assert missing == [], missing


def test_an_optional_argument_is_shown_in_brackets():
    shown = [f"{' '.join(path)} {p.make_metavar(ctx)}" for path, cmd, ctx in _every_command()
             for p in cmd.params if isinstance(p, click.Argument) and not p.required and p.nargs == 1
             and not p.make_metavar(ctx).startswith("[")]
    assert shown == [], shown


def test_every_command_takes_quiet_and_verbose():
    lacking = [" ".join(path) for path, cmd, _ in _every_command()
               if not isinstance(cmd, click.Group) and not {"-q", "-v"} <= {o for p in cmd.params for o in p.opts}]
    assert lacking == [], lacking


def _option(path: list[str], name: str) -> click.Option:
    for p_, cmd, _ in _every_command():
        if p_ == path:
            return next(p for p in cmd.params if isinstance(p, click.Option) and name in p.opts)
    raise AssertionError(path)


def test_the_batch_commands_name_every_batch_tier():
    from sdcloud.batch.submit import BATCH_TIERS
    from sdcloud.commands.batch import BATCH_TIER_NAMES

    assert tuple(BATCH_TIERS) == BATCH_TIER_NAMES
    for path in (["sdcloud", "batch", "submit"], ["sdcloud", "batch", "schedule", "add"]):
        text = _option(path, "--tier").help
        assert all(t in text for t in BATCH_TIERS), (path, text)


def test_every_store_option_names_cos():
    found = [(path, p.help) for path, cmd, _ in _every_command() for p in cmd.params
             if isinstance(p, click.Option) and "--store" in p.opts]
    assert len(found) >= 3
    assert [path for path, text in found if "cos://" not in (text or "")] == []


def test_up_and_offers_name_every_tier_they_take():
    from sdcloud.commands.common import BATCH_TIER_NAMES, TRAIN_TIER_NAMES
    from sdcloud.offers.kinds import RunKind
    from sdcloud.offers.tiers import all_tiers

    tiers = all_tiers().values()
    assert TRAIN_TIER_NAMES == tuple(t.name for t in tiers if t.kind is RunKind.TRAIN)
    assert BATCH_TIER_NAMES == tuple(t.name for t in tiers if t.kind is RunKind.BATCH)
    up = _option(["sdcloud", "up"], "--tier").help
    assert all(t in up for t in TRAIN_TIER_NAMES) and not any(t in up for t in BATCH_TIER_NAMES), up
    offers = _option(["sdcloud", "offers"], "--tier").help
    assert all(t.name in offers for t in tiers), offers


def _help_of(command: str, flag: str) -> str:
    """The help line of one option as `sdcloud COMMAND --help` shows it, before it is wrapped."""
    from sdcloud.cli import root

    cmd = root.get_command(click.Context(root), command)
    ctx = click.Context(cmd, info_name=command)
    opt = next(p for p in cmd.params if flag in p.opts)
    return opt.get_help_record(ctx)[1]


def test_simulate_help_names_every_policy_of_the_registry(capsys):
    import re

    from sdcloud.cli import main
    from sdcloud.spot.simulate import all_policy_names

    listed = re.search(r"Policy to replay \(repeatable\): (.*?)\. Default", _help_of("simulate", "--policy")).group(1)
    assert [n.strip() for n in listed.split(",")] == all_policy_names()
    assert "sdcloud-one-cloud" in listed
    assert main(["simulate", "--help"]) == 0 and "sdcloud-one-cloud" in capsys.readouterr().out


def test_up_and_offers_help_name_the_providers_of_the_registry():
    from sdcloud.providers.traits import has_catalog, names

    assert _help_of("up", "--provider").startswith(", ".join(names()) + " (default: local)")
    assert _help_of("offers", "--provider").startswith(", ".join(names(where=has_catalog)) + ";")
    from sdcloud.cli import root

    batch = root.get_command(click.Context(root), "batch")
    submit = batch.get_command(click.Context(batch), "submit")
    opt = next(p for p in submit.params if "--provider" in p.opts)
    assert opt.get_help_record(click.Context(submit))[1].startswith(", ".join(names()) + ";")
