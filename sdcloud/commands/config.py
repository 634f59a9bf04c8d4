"""`sdcloud config show`: the settings in effect, and where each comes from."""

from __future__ import annotations

import os

import click

from ..render import emit_json, output_options, table, wide_option


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
    from ..providers.local.provider import DEFAULT_NOTICE_SECONDS

    local = cfg.local()
    for key, default, unit in (("price_per_hour", 0.0, " USD/h"), ("notice_seconds", DEFAULT_NOTICE_SECONDS, " s")):
        rows.append((f"local.{key}", f"{local.get(key, default):g}{unit}",
                     "config.toml [local]" if key in local else "built-in default"))
    # Every other setting in config.toml, as written, so that nothing set there is left out.
    shown = {name for name, _, _ in rows}
    for section, table_ in settings.items():
        for key, value in (table_.items() if isinstance(table_, dict) else [("", table_)]):
            name = f"{section}.{key}" if key else section
            if name not in shown and section not in ("defaults", "local"):
                rows.append((name, str(value), f"config.toml [{section}]" if key else "config.toml"))
    if as_json:
        emit_json({name: {"value": value, "source": source} for name, value, source in rows})
        return
    # A value (a path) may be cut across lines of its cell; the setting's name never is.
    table("sdcloud settings", ["setting", "value", "source"], rows, fold=["value", "source"])
