"""Which currency a Tencent Cloud account is billed in: its site decides, not the region.

A China-site account (cloud.tencent.com) sees and pays every region's prices in CNY; an
international-site account (tencentcloud.com) in USD, mainland regions included. Guessing from the
region puts SpotOptions.MaxPrice about 7x off one way or the other.

Where the answer comes from, first found wins:
1. the user's setting: SDCLOUD_TENCENT_SITE (china | international), SDCLOUD_TENCENT_CURRENCY
   (CNY | USD), or `[tencent] site = "..."` in $SDCLOUD_HOME/config.toml;
2. the account itself: the on-demand list prices it is quoted for GPU types, compared with the
   bundled catalog's (which says its currency). The two sites differ by the exchange rate, about
   7x, so the ratio tells them apart without doubt; in between, sdcloud asks for the setting
   rather than guess.
"""

from __future__ import annotations

import os
import statistics
from typing import Any, Callable

from ... import config
from ...errors import UserError
from ..traits import name_of

NAME = name_of(__name__)  # "tencent", or the name a copy of this folder is registered under

SITE_ENV = "SDCLOUD_TENCENT_SITE"
CURRENCY_ENV = "SDCLOUD_TENCENT_CURRENCY"
SITES = {"china": "CNY", "international": "USD"}


def _check_site(value: object, what: str) -> None:
    if str(value).lower() not in SITES:
        raise UserError(f"{what} must be china or international, got {value!r}")


# config.toml [tencent]'s own keys, checked before a run exists (sdcloud/runs/inputs/config_check.py).
CONFIG_KEYS = {"site": _check_site}

# Quoted / reference price (both in CNY): near 1 on the China site, near 1/7 on the international one.
CNY_ABOVE, USD_BELOW = 0.45, 0.3


def configured_currency() -> str | None:
    """The currency the user set, or None; a bad value is one clear UserError."""
    site = os.environ.get(SITE_ENV)
    if site:
        if site.lower() not in SITES:
            raise UserError(f"{SITE_ENV} must be china or international, got {site!r}")
        return SITES[site.lower()]
    currency = os.environ.get(CURRENCY_ENV)
    if currency:
        if currency.upper() not in ("CNY", "USD"):
            raise UserError(f"{CURRENCY_ENV} must be CNY or USD, got {currency!r}")
        return currency.upper()
    conf = config.settings().get(NAME) or {}
    if "site" in conf:
        site = str(conf["site"]).lower()
        if site not in SITES:
            raise UserError(f"config.toml [tencent] site must be china or international, got {conf['site']!r}")
        return SITES[site]
    return None


def detect_currency(region: str, quoted: dict[str, float], reference: Callable[[str], tuple[float, str] | None]) -> str:
    """CNY or USD from on-demand prices the account is quoted in `region` ({instance type: price}),
    against `reference(instance_type)` = (list price, its currency) from the bundled catalog."""
    ratios = []
    for itype, price in quoted.items():
        ref = reference(itype)
        if not ref or not price or price <= 0 or ref[0] <= 0:
            continue
        ref_cny = ref[0] if ref[1] == "CNY" else ref[0] * config.usd_per("USD") / config.usd_per("CNY")
        ratios.append(price / ref_cny)
    hint = f"set {SITE_ENV}=china|international or [tencent] site in config.toml"
    if not ratios:
        raise UserError(f"cannot tell which site your Tencent Cloud account is on (no GPU prices quoted in {region}): {hint}")
    ratio = statistics.median(ratios)
    if ratio >= CNY_ABOVE:
        return "CNY"
    if ratio <= USD_BELOW:
        return "USD"
    raise UserError(f"cannot tell which site your Tencent Cloud account is on (its prices are {ratio:.2f}x the "
                    f"catalog's CNY ones): {hint}")


def bundled_reference(rows: list[Any], region: str) -> Callable[[str], tuple[float, str] | None]:
    """reference() for detect_currency from catalog rows: the same region first, else any."""
    def ref(itype: str) -> tuple[float, str] | None:
        same = [r for r in rows if r.instance_type == itype and r.ondemand_price]
        best = [r for r in same if r.region == region] or same
        return (best[0].ondemand_price, best[0].currency) if best else None
    return ref
