"""`sdcloud config show`: the settings in effect, and where each comes from."""

from __future__ import annotations

import os

import click

from ..render import emit_json, output_options, table, wide_option


def _unsecret(name: str, value: object) -> object:
    """The value with every secret in it masked (a table such as [infra.extra] may hold one)."""
    from .. import config as cfg

    if isinstance(value, dict):
        return {k: _unsecret(f"{name}.{k}", v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unsecret(name, v) for v in value]
    if isinstance(value, str) and not cfg.looks_secret(name, value):
        return cfg.redact(value)  # a secret pasted under another key: masked wherever it stands in the value
    return cfg.masked(value) if cfg.looks_secret(name, value) else value


@click.group()
def config() -> None:
    """Show the settings in effect ($SDCLOUD_HOME/config.toml and the environment)."""


@config.command()
@output_options
@wide_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show(as_json: bool) -> None:
    """The defaults `up` and `offers` use, the currency rate, the local machine's price, every other
    setting in config.toml, and where sdcloud keeps its files."""
    from .. import config as cfg

    home = cfg.home()
    settings = cfg.settings()
    defaults = cfg.defaults()
    rows = [("home", str(home), "SDCLOUD_HOME" if os.environ.get("SDCLOUD_HOME") else "default (~/.sdcloud)"),
            ("config file", str(home / "config.toml"), "present" if (home / "config.toml").exists() else "absent"),
            ("state store", str(home / "state.db"), "")]
    for key in cfg.DEFAULT_KEYS:
        rows.append((f"defaults.{key}", defaults.get(key, ""), "config.toml [defaults]" if key in defaults else "not set"))
    rate = 1 / cfg.usd_per("CNY")
    source = ("SDCLOUD_CNY_PER_USD" if os.environ.get("SDCLOUD_CNY_PER_USD")
              else "config.toml [currency]" if settings.get("currency", {}).get("cny_per_usd") else "built-in default")
    rows.append(("currency.cny_per_usd", f"{rate:g}", source))
    from ..providers.traits import every

    # The providers' own settings (this machine's price and reclaim notice), with their built-in defaults,
    # read and checked first: a bad number is one line, exit 2.
    for t in every():
        cfg.numbers(t.name, [s.key for s in t.settings if s.section == t.name])
    declared = [s for t in every() for s in t.settings]
    for s in declared:
        given = settings.get(s.section, {})
        value = float(given[s.key]) if s.key in given else s.default
        rows.append((f"{s.section}.{s.key}", f"{value:g}{s.unit}",
                     f"config.toml [{s.section}]" if s.key in given else "built-in default"))
    # The Hugging Face token in effect (a gated model's download), masked: which one, never itself.
    from ..runs.inputs.hub_access import ENV_VARS, token

    hf = token()
    hf_source = next((v for v in ENV_VARS if os.environ.get(v, "").strip()), None) or (
        "config.toml [huggingface]" if hf else "not set")
    rows.append(("huggingface.token", cfg.masked(hf) if hf else "", hf_source))
    # Every other setting in config.toml, as written, so that nothing set there is left out; a secret masked.
    shown = {name for name, _, _ in rows}
    for section, table_ in settings.items():
        for key, value in (table_.items() if isinstance(table_, dict) else [("", table_)]):
            name = f"{section}.{key}" if key else section
            if name not in shown and section != "defaults" and section not in {s.section for s in declared}:
                text = str(_unsecret(name, value))
                rows.append((name, text, f"config.toml [{section}]" if key else "config.toml"))
    if as_json:
        emit_json({name: {"value": value, "source": source} for name, value, source in rows})
        return
    # A value (a path) may be cut across lines of its cell; the setting's name never is.
    table("sdcloud settings", ["setting", "value", "source"], rows, fold=["value", "source"])
