"""The modules a provider's traits name, loaded in one place and typed by what they give.

A trait such as `adapter=".compute"` or `bill=".billing"` is a module path relative to the provider's
own package, so that a copy of the folder registered under another name loads its own modules, not
the original's. Everything outside `providers/` asks this loader for what it needs (the Provider
class, the bill reader, the cloud scheduler, the bucket dialect, the config keys, the catalog
refresh) and gets a typed answer, never a module path to import itself (tests/test_layout.py).
"""

from __future__ import annotations

import importlib
import tomllib
from functools import cache
from importlib import resources
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from ..offers.groups import Link
from ..offers.moves import NO_EGRESS, Egress
from .capabilities import ReconcilesBill, SchedulesBatch
from .traits import package_of, read_links, traits


@runtime_checkable
class RunStoreDialect(Protocol):
    """How this machine reaches a bucket of the provider's own dialect (providers/<name>/run_store.py)."""

    CREDENTIALS: str  # the store config's `credentials` value that names this dialect

    def run_store_config(self, conf: dict, infra: dict, region: str | None) -> dict: ...

    def open_run_store(self, conf: dict) -> Any: ...


# refresh_catalog(regions) -> (path written, rows, problems), the refresh `sdcloud catalog refresh` runs.
CatalogRefresh = Callable[[list[str] | None], tuple[Path, list, list[str]]]


def module(name: str, path: str) -> ModuleType:
    """The module `path` of provider `name`: relative to its package (".compute"), imported only now."""
    return importlib.import_module(path, package=package_of(name))


def provider_class(name: str) -> type:
    """The class of provider `name`'s adapter (its `adapter` module's PROVIDER_CLASS)."""
    return module(name, traits(name).adapter).PROVIDER_CLASS


def _declared(name: str, path: str | None, power: type, what: str) -> Any:
    """The module a trait names, checked against the capability protocol it must meet; KeyError where
    the provider declares none."""
    if path is None:
        raise KeyError(f"{name} declares no {what}")
    found = module(name, path)
    assert isinstance(found, power), f"{found.__name__} is not a {what}"
    return found


def bill_reader(name: str) -> ReconcilesBill:
    """The provider's bill reader (capabilities.ReconcilesBill); KeyError where it declares none."""
    return _declared(name, traits(name).bill, ReconcilesBill, "bill reader")


def schedules(name: str) -> SchedulesBatch:
    """The provider's cloud scheduler (capabilities.SchedulesBatch); KeyError where it declares none."""
    return _declared(name, traits(name).schedules, SchedulesBatch, "cloud scheduler")


def infra_check(name: str) -> Callable[[str], None] | None:
    """What the account must have before the provider's stack deploys (`check(region)`, raising a
    UserError that says what to create); None where it declares no check."""
    path = traits(name).infra_check
    return module(name, path).check if path else None


def run_store(name: str) -> RunStoreDialect | None:
    """How this machine opens a bucket of the provider's own dialect; None: the generic S3 store does."""
    path = traits(name).run_store
    if path is None:
        return None
    found = module(name, path)
    assert isinstance(found, RunStoreDialect), f"{found.__name__} is not a bucket dialect"
    return found


def config_keys(name: str) -> dict[str, Callable[[Any, str], Any]]:
    """The keys of the provider's own config.toml section its `config_keys` module checks ({} if none)."""
    path = traits(name).config_keys
    return dict(module(name, path).CONFIG_KEYS) if path else {}


def catalog_refresh(name: str) -> CatalogRefresh | None:
    """The provider's catalog refresh (its catalog's `refresh` module's refresh_catalog); None: it has none."""
    catalog = traits(name).catalog
    if catalog is None or catalog.refresh is None:
        return None
    return module(name, catalog.refresh).refresh_catalog


def public_prices(name: str) -> CatalogRefresh | None:
    """The refresh from the prices the provider publishes for anyone (no credentials); None: none published."""
    catalog = traits(name).catalog
    if catalog is None or catalog.public is None:
        return None
    return module(name, catalog.public).refresh_public


def catalog_build(name: str) -> Callable[[Path], list]:
    """The build(shared) that rebuilds the provider's bundled catalog rows from the shared reference data."""
    catalog = traits(name).catalog
    if catalog is None or catalog.build is None:
        raise KeyError(f"{name} declares no catalog build")
    return module(name, catalog.build).build


@cache
def storage_prices(name: str) -> dict:
    """The provider's list prices for disks, bucket, requests and egress (its `billing.storage_prices`
    file, in its folder); {} where it declares none."""
    path = traits(name).billing.storage_prices
    if path is None:
        return {}
    with resources.files(package_of(name)).joinpath(path).open("rb") as f:
        return tomllib.load(f)


def account_currency(name: str) -> str:
    """The currency the user's account of provider `name` is billed in: what its site says where the
    user set it (traits' `billing.account_currency`), else the provider's billing currency."""
    billing = traits(name).billing
    if billing.account_currency is not None:
        configured = module(name, billing.account_currency).configured_currency()
        if configured:
            return str(configured)
    return billing.currency


def egress_price(name: str, region: str | None = None) -> Egress:
    """The provider's internet egress list price out of its store in `region`, per GB (2^30 bytes), in
    the currency the account is billed in (storage_prices.toml: `egress_gb`, its `[egress_gb_by_region]`
    and, for another site's currency, `[egress_gb_by_currency]`). No price file: no egress charge."""
    prices = storage_prices(name)
    if not prices:
        return NO_EGRESS
    listed = str(prices.get("currency", "USD"))
    currency = account_currency(name)
    if currency != listed:
        other = prices.get("egress_gb_by_currency") or {}
        if currency not in other:
            raise KeyError(f"{name} lists no {currency} egress price (storage_prices.toml [egress_gb_by_currency])")
        return Egress(float(other[currency]), currency, f"{name} list egress {float(other[currency]):g} {currency}/GB "
                                                         f"({currency} account)")
    by_region = prices.get("egress_gb_by_region") or {}
    if region and region in by_region:
        per_gb = float(by_region[region])
        return Egress(per_gb, listed, f"{name} {region} list egress {per_gb:g} {listed}/GB")
    per_gb = float(prices.get("egress_gb", 0.0))
    return Egress(per_gb, listed, f"{name} list egress {per_gb:g} {listed}/GB")


def interconnect(name: str) -> dict[str, Link]:
    """The provider's network between two hosts, by instance type ("*": every type it does not list),
    from its `network` trait (traits.read_links: one interface's share of a multi-card type, its flow
    limits); {} where it declares none."""
    network = traits(name).network
    return read_links(name, network) if network is not None else {}
