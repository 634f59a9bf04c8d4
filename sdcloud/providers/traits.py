"""What each provider is, declared as data: the one place the rest of sdcloud learns about a cloud.

Each `providers/<name>/__init__.py` declares a `TRAITS = ProviderTraits(...)` without importing
its SDK, so that `sdcloud --help`, the CLI's choice lists, the stacks, the cloud function's handler
and the cost report can all read it cheaply. Code outside `providers/` asks these records (or a
capability protocol of `capabilities.py`), never a provider's name: a fifth provider is then one
new folder, not a hunt through the house for `== "aws"`.

`names(where=...)` answers every "which providers ..." question (the CLI's `--provider` choices,
the providers that have a stack, a catalog, a cloud function).
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache

# Every provider's package, in the order the CLI lists them.
PACKAGES = ("aws", "tencent", "local", "ssh")


class Hosts(StrEnum):
    """Whose machines a provider runs on; it decides pricing, teardown and what a deadline can buy."""
    CLOUD = "cloud"  # rented by the hour from a cloud: spot and on-demand, zones, a stack, a bill
    OWN = "own"  # boxes the user owns (SSH): no bill, no spot market, nothing to tear down
    THIS_MACHINE = "this-machine"  # this computer: files are read in place, nothing is uploaded first


@dataclass(frozen=True)
class Timing:
    """How the controller watches a host of this provider."""
    poll_seconds: float  # between two controller steps
    boot_timeout: float  # launch to first heartbeat before the host counts as failed
    heartbeat_timeout: float  # a heartbeat older than this: the host is lost
    cooldown_seconds: float  # a zone reclaimed or sold out is skipped this long (fleet/lifecycle.py)
    # Seconds between a spot reclaim notice and the host's end (None: not declared, and the host then
    # assumes its save cannot beat it); the host spaces its checkpoints by it (sdcloud_agent/checkpoint_spacing.py).
    reclaim_notice_seconds: float | None = None


@dataclass(frozen=True)
class HostTraits:
    """What the host agent is told about the machine it runs on (the agent config's keys)."""
    nvme: bool  # prepare local NVMe for data and checkpoints (cloud GPU hosts have it)
    gpu_required: bool  # refuse to train without CUDA (a box of the user's may train on CPU)
    metadata: str  # which of the agent's clouds/ modules watches the notice: "aws", "tencent" or "none"
    heartbeat_seconds: float
    poll_seconds: float


@dataclass(frozen=True)
class Billing:
    """How the provider bills a host (costs/billing_rules.py applies it)."""
    currency: str  # the currency its prices are quoted in (Tencent's international site: USD)
    granularity_seconds: float = 1.0  # per-second billing on both clouds
    minimum_seconds: float = 0.0  # AWS bills at least 60 s per instance start
    # AWS does not charge a spot instance it interrupts in its first hour.
    free_spot_interrupt_seconds: float = 0.0
    free: bool = False  # no bill at all unless the user gave an hourly price (own boxes, this machine)


@dataclass(frozen=True)
class CodeLimits:
    """What the cloud refuses of a function's code (the figures and their sources: providers/<name>/limits.py).
    `sdcloud infra up` checks the driver's package against them before it deploys anything."""
    unzipped_bytes: int  # the code unpacked, layers included
    inline_zip_bytes: int  # a zip sent inside the create request itself
    request_bytes: int  # the create request's whole body (a zip inline is base64: 4/3 of its size)
    environment_bytes: int  # the function's environment variables, keys and values together


@dataclass(frozen=True)
class CloudFunction:
    """The provider's cloud driver (runs/unattended.py): the one copy of its settings.

    The stacks create the function from these figures, the handler stops its steps `safety_seconds`
    before `timeout_seconds`, and the cost report prices each invocation from them.
    """
    name: str  # the driver's name in the lease and the journal ("aws-lambda")
    # The platform's own name for its Python runtime ("python3.13", "Python3.10"): the stacks create the
    # function with it, and the package is built for and tested under its version (`python`).
    runtime: str
    timeout_seconds: int  # below the schedule's period, so that two invocations never overlap
    memory_mb: int
    safety_seconds: float  # the handler's margin before the timeout: the journal is written back
    schedule_seconds: int
    # List prices in USD, first tier, no free tier (docs/runs.md "The cloud driver's cost"); None: unpriced.
    request_usd: float | None = None
    gb_second_usd: float | None = None
    price_source: str = ""
    code_limits: CodeLimits | None = None
    # The stack uploads the package to the run bucket and creates the function from there: the
    # create request could not carry it inline (Tencent Cloud API 3.0 takes at most 10 MB a POST).
    code_from_bucket: bool = False

    @property
    def memory_gb(self) -> float:
        return self.memory_mb / 1024.0

    @property
    def python(self) -> tuple[int, int]:
        """The (major, minor) Python version of `runtime`: Lambda says "python3.13", SCF "Python3.10"."""
        found = re.fullmatch(r"[Pp]ython(\d+)\.(\d+)", self.runtime)
        if found is None:
            raise ValueError(f"{self.name}: {self.runtime!r} is not a Python runtime")
        return int(found[1]), int(found[2])


@dataclass(frozen=True)
class NetworkProfile:
    """The defaults of the agent's `network` setting for hosts in some regions (runs/network.py layers
    config.toml and the run file over them)."""
    name: str  # what runs/network.profile calls it ("mainland")
    regions: frozenset[str]
    defaults: dict[str, str]


@dataclass(frozen=True)
class Setting:
    """A config.toml setting of a provider, with its built-in default: `sdcloud config show` lists it."""
    section: str  # the config.toml table ("local")
    key: str
    default: float
    unit: str = ""  # shown after the value (" USD/h", " s")


@dataclass(frozen=True)
class ProviderTraits:
    name: str
    hosts: Hosts
    adapter: str  # the module whose PROVIDER_CLASS is the Provider (imported only when used)
    timing: Timing
    host: HostTraits
    billing: Billing
    default_region: str = ""
    # The Pulumi stack under stacks/ (None: this provider needs no infrastructure).
    stack: str | None = None
    # The bucket dialects a run's store may use on this provider ("s3", "cos"); () = none is needed.
    stores: tuple[str, ...] = ()
    # Where past spot prices come from: "history" (the cloud's price history API), "samples" (the
    # controller samples the quote while the host runs), None (no spot market).
    spot_prices: str | None = None
    # A bundled price catalog in sdcloud/data/catalog/<name>.csv that `offers` ranks.
    catalog: bool = False
    function: CloudFunction | None = None
    # Environment variable that overrides `default_region` (AWS_DEFAULT_REGION), if any.
    region_env: str | None = None
    # config.toml sections this provider reads (besides [defaults]); `config show` lists them.
    config_sections: tuple[str, ...] = field(default_factory=tuple)
    # The module whose CONFIG_KEYS ({key: check(value, what)}) names and checks the keys of its own
    # section beyond `settings` and the spot discount (sdcloud/runs/config_check.py); None: no others.
    config_keys: str | None = None
    # Its prices are published for anyone to read: `catalog refresh --public` reads them without
    # credentials (offers/public_prices.py).
    public_price_list: bool = False
    # Settings of those sections that have a built-in default (`config show` shows the default when unset).
    settings: tuple[Setting, ...] = ()
    # The NVIDIA driver series its per-run user-data installs when the stack names none (the image
    # brings none); None: the image has its driver (runs/hostboot.py).
    host_driver: str | None = None
    # Networks whose hosts get other defaults for outside things (a pip mirror, a hub mirror): the
    # first profile whose regions hold the host's region applies (runs/network.py).
    network_profiles: tuple[NetworkProfile, ...] = ()
    # The module that says how this machine opens a bucket of this provider's own dialect, with
    # `CREDENTIALS`, `run_store_config(conf, infra, region)` and `open_run_store(conf)` (runs/store.py);
    # None: the generic S3 store does.
    run_store: str | None = None
    # The module that reads the cloud's bill (capabilities.ReconcilesBill, `sdcloud cost reconcile`);
    # None: nothing bills this provider's hosts.
    bill: str | None = None
    # The module that puts a batch schedule on the cloud's own scheduler, invoking the cloud driver
    # (capabilities.SchedulesBatch, `sdcloud batch schedule add --provider`); None: the laptop's timer only.
    schedules: str | None = None
    # The module whose `check(region)` says, before the stack deploys, what the account lacks that the
    # deployment needs (a service role), in one line (`sdcloud infra up`); None: nothing to check.
    infra_check: str | None = None
    # The longest object key its bucket takes, in bytes of UTF-8 (providers/<name>/limits.py): a
    # dataset file whose key would be longer is refused before launch (runs/datasets.py); None: no limit.
    object_key_bytes: int | None = None

    @property
    def is_cloud(self) -> bool:
        return self.hosts is Hosts.CLOUD

    @property
    def free(self) -> bool:
        return self.billing.free


@cache
def traits(name: str) -> ProviderTraits:
    """The traits of provider `name` (an exact name; match user input with `names.match_name` first)."""
    if name not in PACKAGES:
        raise KeyError(name)
    return importlib.import_module(f"sdcloud.providers.{name}").TRAITS


def default_region(name: str) -> str:
    """The region a provider's stack goes to when the user names none: its `region_env` if set, else
    its declared default ("" for a provider without regions)."""
    t = traits(name)
    return (os.environ.get(t.region_env) if t.region_env else None) or t.default_region


def every() -> list[ProviderTraits]:
    return [traits(n) for n in PACKAGES]


def names(where: Callable[[ProviderTraits], bool] | None = None) -> tuple[str, ...]:
    """The providers whose traits satisfy `where` (all of them without it), in PACKAGES order."""
    return tuple(t.name for t in every() if where is None or where(t))


# Predicates for names(where=...), named for what the caller asks.
def is_cloud(t: ProviderTraits) -> bool:
    return t.is_cloud


def has_stack(t: ProviderTraits) -> bool:
    return t.stack is not None


def has_function(t: ProviderTraits) -> bool:
    return t.function is not None


def has_catalog(t: ProviderTraits) -> bool:
    return t.catalog
