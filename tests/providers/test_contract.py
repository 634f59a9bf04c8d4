"""The contract every registered provider keeps (sdcloud/providers/base.py: Provider), run over each of
`traits.names()`, each against the stand-in its own tests use: moto in-process for AWS, the CVM fake
for Tencent, real agent processes on this machine for the local provider, a real sshd on 127.0.0.1
for SSH (skipped where openssh-server is missing, as its own tests are), the API fake over HTTPS for Vast.ai.

- a launch is idempotent on its token: the same run and attempt adopt the live host, a new attempt
  starts another;
- hosts are found by their `sdcloud:run` tag, for one run or for all;
- terminate ends a host: it leaves `find_tagged`;
- the provider is a `Provider` and has exactly the powers the capability table gives it;
- prices are numbers a run can be costed with: its offers', its price history's, its launched host's;
- errors are typed: a launch that cannot happen raises a ProviderError or a UserError, and leaves
  no host behind.

A provider registered without a driver here fails `test_every_provider_is_driven`: a new cloud
brings its stand-in to this file.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable

import pytest

from sdcloud.errors import UserError
from sdcloud.offers.optimizer import Offer
from sdcloud.offers.tiers import get_tier
from sdcloud.providers import get_provider
from sdcloud.providers.base import LaunchSpec, Provider, ProviderError
from sdcloud.providers.capabilities import Closable, HasZones
from sdcloud.providers.traits import names

from tests.providers.aws.test_aws import REGION as AWS_REGION
from tests.providers.aws.test_aws import ami, ec2, fail_with, inject, offer as aws_offer  # noqa: F401  (ami, ec2: fixtures)
from tests.providers.tencent.test_tencent import REGION as TENCENT_REGION
from tests.providers.tencent.test_tencent import fake, row as tencent_row, spec as tencent_spec  # noqa: F401  (fake: a fixture)
from tests.providers.test_provider_capabilities import EXPECTED, capabilities

# A host that keeps running until it is ended: the real agent, training with a command that sleeps.
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


@dataclass
class Driven:
    """One provider as its tests drive it: what to launch, and how to make a launch impossible."""

    provider: Provider
    offer: Offer
    spec: Callable[[str, int], LaunchSpec]
    # Makes the next launch impossible the way this provider's hosts run out; returns the launch's max_price.
    refuse: Callable[[], float | None]


def _agent_spec(tmp_path, run_id: str, attempt: int) -> LaunchSpec:
    cfg = {"run_id": run_id, "attempt": attempt, "trainer": "command", "steps": 10, "checkpoint_every": 5,
           "trainer_args": SLEEPER, "store": {"url": (tmp_path / "bucket").as_uri()}, "nvme": False,
           "require_gpu": False, "heartbeat_seconds": 1, "poll_seconds": 1}
    return LaunchSpec(run_id=run_id, attempt=attempt, agent_config=cfg)


def _aws(request, tmp_path) -> Driven:
    provider = get_provider("aws", region=AWS_REGION, image_id=request.getfixturevalue("ami"), retry_base=0, retry_cap=0)

    def refuse() -> None:
        inject(provider, "RunInstances", lambda body: fail_with("InsufficientInstanceCapacity"))

    return Driven(provider, aws_offer(market="on-demand"), lambda run, attempt: LaunchSpec(run, attempt), refuse)


def _tencent(request, tmp_path) -> Driven:
    request.getfixturevalue("fake")
    cvm = request.getfixturevalue("fake").cvm
    provider = get_provider("tencent", poll_interval=0.03, launch_timeout=10, backoff=0.01, backoff_max=0.05)
    row = tencent_row()

    def refuse() -> None:
        for zone in provider.zones(TENCENT_REGION):
            cvm.set_sold_out(zone, row.instance_type)

    return Driven(provider, Offer(row, "on-demand"), lambda run, attempt: tencent_spec(run, attempt), refuse)


def _local(request, tmp_path) -> Driven:
    provider = get_provider("local", price_per_hour=0.25)
    return Driven(provider, provider.offers(get_tier("sd15-lora"), "on-demand")[0],
                  lambda run, attempt: _agent_spec(tmp_path, run, attempt), lambda: 0.1)


def _ssh(request, tmp_path) -> Driven:
    from tests.support.server_sshd import write_hosts

    sshd = request.getfixturevalue("sshd")
    home = request.getfixturevalue("sdcloud_home")
    # Two boxes behind the one server: a box runs one host at a time, and the contract launches two.
    write_hosts(home / "ssh-hosts.toml", [sshd.host_entry(box, tmp_path / f"{box}-workdir", python=sys.executable,
                                                          price_per_hour=0.25) for box in ("box-a", "box-b")])
    provider = get_provider("ssh")
    return Driven(provider, provider.offers(get_tier("sd15-lora"), "on-demand")[0],
                  lambda run, attempt: _agent_spec(tmp_path, run, attempt), lambda: 0.1)


def _vast(request, tmp_path) -> Driven:
    from tests.support.clouds.fake_vast import KEY, FakeVastServer

    server = FakeVastServer(tmp_path / "vast-tls").start()
    request.addfinalizer(server.stop)
    monkeypatch = request.getfixturevalue("monkeypatch")
    for k, v in {"SDCLOUD_VAST_ENDPOINT": server.url, "VAST_API_KEY": KEY, "SSL_CERT_FILE": str(server.ca_file)}.items():
        monkeypatch.setenv(k, v)
    provider = get_provider("vast", backoff=0.0, poll_interval=0.01)
    offer = next(o for o in provider.offers(get_tier("sd15-lora"), "on-demand")
                 if o.row.gpu == "RTX4090" and o.row.gpu_count == 1)

    def refuse() -> None:  # every machine rented by someone else: no offer to create from
        for a in server.fake.asks.values():
            a["rented"] = True

    return Driven(provider, offer, lambda run, attempt: LaunchSpec(run, attempt, user_data="echo"), refuse)


DRIVERS: dict[str, Callable[..., Driven]] = {"aws": _aws, "tencent": _tencent, "local": _local, "ssh": _ssh, "vast": _vast}


def wait_until(cond: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(params=names())
def driven(request, aws_env, tmp_path, sdcloud_home):
    name = request.param
    if name not in DRIVERS:
        pytest.fail(f"provider {name!r} has no driver in tests/providers/test_contract.py")
    d = DRIVERS[name](request, tmp_path)
    yield d
    # Never leave a host behind, whatever the test did.
    try:
        live = d.provider.find_tagged()
        if live:
            d.provider.terminate([i.id for i in live])
    finally:
        if isinstance(d.provider, Closable):
            d.provider.close()


def test_every_provider_is_driven():
    assert set(names()) <= set(DRIVERS), "a new provider brings its stand-in to DRIVERS"


def test_a_launch_is_idempotent_on_its_token(driven):
    p = driven.provider
    first = p.launch(driven.offer, driven.spec("r-contract", 1), "on-demand")
    assert not first.adopted and first.live and first.run_id == "r-contract"
    assert driven.spec("r-contract", 1).tags.items() <= first.tags.items()  # run, attempt, token
    again = p.launch(driven.offer, driven.spec("r-contract", 1), "on-demand")
    assert again.adopted and again.id == first.id
    other = p.launch(driven.offer, driven.spec("r-contract", 2), "on-demand")
    assert not other.adopted and other.id != first.id
    assert sorted(i.id for i in p.find_tagged("r-contract")) == sorted([first.id, other.id])


def test_hosts_are_found_by_their_run_tag_and_terminate_ends_them(driven):
    p = driven.provider
    a = p.launch(driven.offer, driven.spec("r-a", 1), "on-demand")
    b = p.launch(driven.offer, driven.spec("r-b", 1), "on-demand")
    assert [i.id for i in p.find_tagged("r-a")] == [a.id]
    assert {i.id for i in p.find_tagged()} >= {a.id, b.id}
    assert [i.id for i in p.describe([a.id], a.region)] == [a.id]
    p.terminate([a.id], a.region)
    wait_until(lambda: not p.find_tagged("r-a"), 30, "the terminated host to leave find_tagged")
    assert not any(i.live for i in p.describe([a.id], a.region))
    assert [i.id for i in p.find_tagged("r-b")] == [b.id]


def test_the_provider_has_exactly_the_powers_of_the_capability_table(driven):
    assert isinstance(driven.provider, Provider)
    assert driven.provider.name in EXPECTED, "a new provider declares its powers in test_provider_capabilities.EXPECTED"
    assert capabilities(driven.provider) == EXPECTED[driven.provider.name]


def test_prices_are_numbers_a_run_is_costed_with(driven):
    p = driven.provider
    offers = p.offers(get_tier("sd15-lora"), "on-demand")
    assert offers and all(o.row.provider == p.name and o.market == "on-demand" for o in offers)
    for o in offers:
        assert o.price_per_hour is not None and math.isfinite(o.price_per_hour) and o.price_per_hour >= 0
    end = datetime.now(timezone.utc)
    region = driven.offer.row.region
    zone = driven.offer.row.zone or (p.zones(region)[0] if isinstance(p, HasZones) else region)
    for at, price in p.price_history(driven.offer.row.instance_type, zone, end - timedelta(hours=1), end):
        assert isinstance(at, datetime) and math.isfinite(price) and price >= 0
    host = p.launch(driven.offer, driven.spec("r-price", 1), "on-demand")
    assert host.price_per_hour is None or (math.isfinite(host.price_per_hour) and host.price_per_hour >= 0)


def test_a_launch_that_cannot_happen_raises_a_typed_error_and_leaves_nothing(driven):
    max_price = driven.refuse()
    with pytest.raises((ProviderError, UserError)):
        driven.provider.launch(driven.offer, driven.spec("r-refused", 1), "on-demand", max_price=max_price)
    assert driven.provider.find_tagged("r-refused") == []
