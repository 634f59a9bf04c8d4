"""What each provider can do, and what it declares about itself, held to one table.

The optional powers are protocols (sdcloud/providers/capabilities.py) checked with isinstance on a
provider built as the other tests build it (no network: every adapter connects lazily). A power
gained or lost changes this table on purpose, never by a renamed method. The traits (each
`providers/<name>/__init__.py` TRAITS) must name their own package, an importable adapter, a cloud
function exactly where there is a stack, and agree with what the rest of sdcloud derives from them.
"""

from __future__ import annotations


import pytest

from sdcloud.providers import capabilities as caps
from sdcloud.providers import loader
from sdcloud.providers import get_provider
from sdcloud.providers.traits import (PACKAGES, Hosts, has_catalog, has_function, has_stack, is_cloud, names,
                                      traits)

from tests.support import ROOT
from tests.support.harness_stacks import stack_module

PROTOCOLS = {
    "zones": caps.HasZones, "check_credentials": caps.ChecksCredentials, "renew_credentials": caps.RenewsHostCredentials,
    "shell": caps.HasShell, "close": caps.Closable, "simulated_reclaim": caps.SimulatesReclaim,
    "host_dir": caps.HasHostDir, "search_errors": caps.ReportsSearchErrors, "price_history": caps.HasPriceHistory,
    "groups": caps.LaunchesGroups,
    "bid": caps.ChangesBid,
}
# What each provider can do. Changing a provider's powers means changing this table in the same commit.
EXPECTED = {
    "aws": {"zones", "search_errors", "price_history", "groups"},
    "tencent": {"zones", "check_credentials", "search_errors", "price_history", "groups"},
    "local": {"close", "simulated_reclaim", "host_dir", "price_history", "groups"},
    "ssh": {"check_credentials", "renew_credentials", "shell", "close", "search_errors", "price_history"},
    "vast": {"check_credentials", "price_history", "bid"},
}


@pytest.fixture
def built(aws_env, tmp_path) -> dict[str, object]:
    """One provider of each kind, built cheaply: nothing here connects, launches or reads a hosts file."""
    made = {name: get_provider(name, **({"hosts_file": tmp_path / "ssh-hosts.toml"} if name == "ssh" else {}))
            for name in names()}
    yield made
    for p in made.values():
        if isinstance(p, caps.Closable):
            p.close()


def capabilities(provider: object) -> set[str]:
    return {what for what, proto in PROTOCOLS.items() if isinstance(provider, proto)}


def test_each_providers_capabilities(built):
    found = {name: capabilities(p) for name, p in built.items()}
    assert found == EXPECTED


def test_a_provider_without_a_power_is_not_taken_for_one():
    # The check can fail: an object with only some of the members satisfies only those protocols.
    class Partial:
        def zones(self, region: str) -> list[str]:
            return []

    assert capabilities(Partial()) == {"zones"}
    assert capabilities(object()) == set()


def test_the_names_are_the_packages_and_each_declares_itself():
    on_disk = {p.parent.name for p in (ROOT / "sdcloud/providers").glob("*/__init__.py")}
    assert set(names()) == on_disk == set(PACKAGES)
    for name in names():
        t = traits(name)
        assert t.name == name
        cls = loader.provider_class(name)
        assert cls.__module__.startswith(f"sdcloud.providers.{name}.")
        assert cls.name == name
        assert t.timing.poll_seconds > 0 and t.timing.boot_timeout > 0 and t.timing.heartbeat_timeout > 0


def test_a_cloud_function_exactly_where_there_is_a_stack():
    for name in names():
        t = traits(name)
        assert (t.function is not None) == (t.stack is not None), name
        if t.function is None:
            continue
        f = t.function
        assert f.name and f.runtime
        # The margin fits in the timeout, and the timeout in the schedule's period (no overlap).
        assert 0 < f.safety_seconds < f.timeout_seconds < f.schedule_seconds, name
        assert f.memory_mb > 0
        assert (ROOT / "stacks" / t.stack.folder / "Pulumi.yaml").is_file(), name
        assert (ROOT / "stacks" / t.stack.folder / f"{t.stack.module}.py").is_file(), name
    # A cloud with a bucket of its own deploys a stack; a marketplace without one (Vast.ai) needs none.
    assert names(where=has_stack) == names(where=has_function) == names(where=lambda t: is_cloud(t) and t.market.object_store)
    assert set(names(where=has_stack)) <= set(names(where=is_cloud))


def test_the_traits_agree_with_what_sdcloud_derives_from_them():
    from sdcloud.costs.driver import functions
    from sdcloud.infra import automation
    from sdcloud.offers.catalog import providers

    # The bundled catalogs are the providers with a catalog (offers sit below providers and are told where they lie).
    assert providers() == names(where=has_catalog)
    assert automation.PROVIDERS == names(where=has_stack)
    assert automation.DRIVER_PROVIDERS == names(where=has_function)
    assert set(functions()) == {traits(n).function.name for n in names(where=has_function)}
    for name in names():
        t = traits(name)
        assert (t.hosts is Hosts.CLOUD) != t.billing.free, name  # clouds bill, the rest is free unless priced
        assert (t.spot_prices is None) == (not t.is_cloud), name
        if t.bill is not None:
            assert isinstance(loader.bill_reader(name), caps.ReconcilesBill), name


@pytest.mark.parametrize("name", names(where=has_function))
def test_the_stacks_read_the_function_from_the_traits(name, monkeypatch):
    """The stack's policy module (readable without Pulumi) carries the traits' figures, not its own."""
    f = traits(name).function
    module = {"aws": "driver_policy", "tencent": "scf_policy"}[name]
    policy = stack_module(traits(name).stack.folder, module)
    assert (policy.FUNCTION_TIMEOUT, policy.FUNCTION_MEMORY_MB, policy.FUNCTION_RUNTIME, policy.SCHEDULE_SECONDS) == (
        f.timeout_seconds, f.memory_mb, f.runtime, f.schedule_seconds)
