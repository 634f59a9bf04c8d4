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

from ..offers import told

# Every provider's package, in the order the CLI lists them. A provider's name is its package's name
# under sdcloud.providers; one more is registered with `register(name)`.
PACKAGES = ("aws", "tencent", "local", "ssh", "vast")
_registered: list[str] = []


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
    # The list prices of its disks, bucket, requests and egress: a TOML file in the provider's folder
    # (costs/billing_rules.py); None: nothing beside the host is charged.
    storage_prices: str | None = None
    # The module (relative to the provider's package) whose configured_currency() says the currency the
    # user's account is billed in where the site decides it, not the provider (Tencent: china / international);
    # None: always `currency`. Its egress is then read from the list of that currency (loader.egress_price).
    account_currency: str | None = None


@dataclass(frozen=True)
class MarketRules:
    """How the provider's market behaves where the clouds differ (a marketplace of machines is not a zone).
    The defaults are the clouds': AWS and Tencent Cloud."""
    multi_node: bool = True  # hosts of one run may form a group (providers/groups.py)
    reclaim_notice: bool = True  # a spot host is warned before it is taken back (AWS: 2 min)
    # An outbid host is paused, not ended: it keeps its disk (billed) and resumes on the same machine
    # when its bid wins again (spot/pause.py decides: wait, raise the bid, or relaunch).
    pauses: bool = False
    bandwidth_priced: bool = False  # each machine prices the run's upload and download bytes (in the estimate)
    object_store: bool = True  # the provider has a bucket of its own; False: the run's store is another cloud's


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
    """The provider's cloud driver (driver/unattended.py): the one copy of its settings.

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
    # The module (relative to the provider's package) that says how the platform calls the function:
    # matches(event), time_left(context, started), request_id(context), HANDLER, ENTRY_FILES and
    # REQUIREMENTS (providers/functions.py reads it for the driver and its package).
    entry: str = ".function"

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
    """The defaults of the agent's `network` setting for hosts in some regions (runs/inputs/network.py layers
    config.toml and the run file over them)."""
    name: str  # what runs/network.profile calls it ("mainland")
    regions: frozenset[str]
    defaults: dict[str, str]


@dataclass(frozen=True)
class Stack:
    """The provider's Pulumi stack: the program under stacks/<folder>/ that infra/automation.py runs inline."""
    folder: str  # under stacks/ ("aws"): a copy of the provider's folder keeps the original's stack
    module: str  # the program's module in that folder (its build(), load_config() and StackConfig)
    region_key: str  # the Pulumi config key that holds the region ("aws:region")
    plugin: str  # the Pulumi resource plugin the program needs ("aws")
    distribution: str  # the Python distribution of the plugin's SDK: its version names the plugin's ("pulumi-aws")
    plugin_server: str | None = None  # where the plugin is downloaded from; None: Pulumi's own registry


@dataclass(frozen=True)
class PriceCatalog:
    """A provider's price catalog: the bundled file `offers` ranks and how it is refreshed. Paths are
    relative to the provider's own folder and package, so a copy of the folder brings its catalog."""
    bundled: str = "catalog.csv"  # the bundled snapshot, a file in the provider's folder
    refresh: str | None = ".catalog"  # the module whose refresh_catalog(regions) `catalog refresh` runs
    # The module whose refresh_public(regions) reads the prices the cloud publishes for anyone
    # (`catalog refresh --public`, no credentials); None: it publishes no machine-readable list.
    public: str | None = None
    # What the staleness warning tells the user to run ({name}: the provider's name); "" the plain refresh.
    hint: str = ""
    # The module whose build(shared) rebuilds the bundled rows from public figures
    # (`python -m sdcloud.providers.build_catalogs`); None: the bundled file is kept by hand.
    build: str | None = None

    def refresh_hint(self, name: str) -> str:
        return self.hint.format(name=name) if self.hint else f"`sdcloud catalog refresh --provider {name}`"


@dataclass(frozen=True)
class Network:
    """The network between two hosts of a group, as the provider declares it: each type's line rate in
    a CSV file of its folder (instance_type, network_gbps, network_cards, basis, placement, efa, source;
    "*" for every type it does not list), and how fast one TCP flow may go and how many flows NCCL's
    socket transport opens between two hosts (offers/groups.py's model; traits.read_links reads them)."""
    interconnect: str  # the CSV file, in the provider's folder
    cluster_flow_gbps: float  # one flow inside the closest placement the provider offers ("cluster")
    zone_flow_gbps: float  # one flow between two hosts of one zone, nothing closer ("zone")
    flows: int  # TCP flows between two hosts (NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD)
    source: str  # where the flow figures come from


@dataclass(frozen=True)
class Setting:
    """A config.toml setting of a provider, with its built-in default: `sdcloud config show` lists it."""
    section: str  # the config.toml table ("local")
    key: str
    default: float
    unit: str = ""  # shown after the value (" USD/h", " s")


@dataclass(frozen=True)
class ProviderTraits:
    # Its package's name (`name_of(__name__)` in its __init__.py): a copy of the folder is another provider.
    # Every module path below is relative to that package (".compute"), loaded by providers/loader.py.
    name: str
    hosts: Hosts
    adapter: str  # the module whose PROVIDER_CLASS is the Provider (imported only when used)
    timing: Timing
    host: HostTraits
    billing: Billing
    default_region: str = ""
    # The Pulumi stack under stacks/ (None: this provider needs no infrastructure).
    stack: Stack | None = None
    # The bucket dialects a run's store may use on this provider (sdcloud_agent.store.dialects); () = none is needed.
    stores: tuple[str, ...] = ()
    # Where past spot prices come from: "history" (the cloud's price history API), "samples" (the
    # controller samples the quote while the host runs), None (no spot market).
    spot_prices: str | None = None
    # A bundled price catalog that `offers` ranks, and its refresh (None: no catalog).
    catalog: PriceCatalog | None = None
    function: CloudFunction | None = None
    # Environment variable that overrides `default_region` (AWS_DEFAULT_REGION), if any.
    region_env: str | None = None
    # config.toml sections this provider reads (besides [defaults]); `config show` lists them.
    config_sections: tuple[str, ...] = field(default_factory=tuple)
    # The module whose CONFIG_KEYS ({key: check(value, what)}) names and checks the keys of its own
    # section beyond `settings` and the spot discount (sdcloud/runs/inputs/config_check.py); None: no others.
    config_keys: str | None = None
    # Settings of those sections that have a built-in default (`config show` shows the default when unset).
    settings: tuple[Setting, ...] = ()
    # The NVIDIA driver series its per-run user-data installs when the stack names none (the image
    # brings none); None: the image has its driver (runs/driving/hostboot.py).
    host_driver: str | None = None
    # Networks whose hosts get other defaults for outside things (a pip mirror, a hub mirror): the
    # first profile whose regions hold the host's region applies (runs/inputs/network.py).
    network_profiles: tuple[NetworkProfile, ...] = ()
    # The module that says how this machine opens a bucket of this provider's own dialect, with
    # `CREDENTIALS`, `run_store_config(conf, infra, region)` and `open_run_store(conf)` (runs/records/store.py);
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
    # dataset file whose key would be longer is refused before launch (runs/inputs/datasets.py); None: no limit.
    object_key_bytes: int | None = None
    # The network between two of its hosts (`offers --nodes N`, the group launch): None, assumed.
    network: Network | None = None
    # Where its market differs from the clouds': pauses, notices, priced bandwidth, its own bucket.
    market: MarketRules = field(default_factory=MarketRules)

    @property
    def is_cloud(self) -> bool:
        return self.hosts is Hosts.CLOUD

    @property
    def free(self) -> bool:
        return self.billing.free

    @property
    def public_price_list(self) -> bool:
        """Its prices are published for anyone to read: `catalog refresh --public` needs no credentials."""
        return self.catalog is not None and self.catalog.public is not None


def name_of(module: str) -> str:
    """The provider a module of `sdcloud.providers.<name>` belongs to: its folder's name, so that a
    copy of the folder registered under another name calls itself by that name."""
    prefix = f"{__package__}."
    if not module.startswith(prefix):
        raise ValueError(f"{module} is not in a provider's package")
    return module.removeprefix(prefix).split(".", 1)[0]


def package_of(name: str) -> str:
    """The package provider `name` is (module paths in its traits are relative to it)."""
    return f"{__package__}.{name}"


def packages() -> tuple[str, ...]:
    """Every registered provider: the shipped PACKAGES, then those registered since, in that order."""
    return (*PACKAGES, *_registered)


def register(name: str) -> None:
    """Register the provider whose package is `sdcloud.providers.<name>` (one that PACKAGES does not
    list: a folder added beside the shipped ones, or found on `sdcloud.providers.__path__`)."""
    if name not in packages():
        _registered.append(name)
        traits.cache_clear()
    traits(name)  # read now: what it tells the layers below (its catalog) is known from here on


def unregister(name: str) -> None:
    """Forget a provider `register` added (the shipped ones stay)."""
    if name in _registered:
        from ..offers.catalog import forget_bundled
        from ..offers.groups import forget_links

        _registered.remove(name)
        traits.cache_clear()
        forget_bundled(name)
        forget_links(name)


@cache
def traits(name: str) -> ProviderTraits:
    """The traits of provider `name` (an exact name; match user input with `names.match_name` first)."""
    if name not in packages():
        raise KeyError(name)
    declared = importlib.import_module(package_of(name)).TRAITS
    if declared.name != name:
        raise ValueError(f"{package_of(name)} declares itself {declared.name!r}: name it with name_of(__name__)")
    if declared.catalog is not None:
        # Offers sit below providers: they are told where the bundled file lies (in the provider's folder).
        from importlib import resources

        from ..offers.catalog import tell_bundled

        tell_bundled(name, resources.files(package_of(name)).joinpath(declared.catalog.bundled),
                     declared.catalog.refresh_hint(name))
    if declared.network is not None:
        # The same for its network facts: parsed when first asked for (offers/groups.py).
        from functools import partial

        from ..offers.groups import tell_links

        tell_links(name, partial(read_links, name, declared.network))
    return declared


def read_links(name: str, network: Network) -> dict:
    """Provider `name`'s network (its `interconnect` file, in its folder, and its flow limits) as
    offers.groups.Link by instance type ("*": every type it does not list). A type with several network
    cards is counted at one card's share: sdcloud attaches one interface (on card 0) to each host.
    providers/loader.interconnect is its typed door."""
    import csv
    import io
    from importlib import resources

    from ..offers.groups import Link

    out = {}
    text = resources.files(package_of(name)).joinpath(network.interconnect).read_text()
    for r in csv.DictReader(io.StringIO(text)):
        host, cards = float(r["network_gbps"]), max(1, int(r.get("network_cards") or 1))
        flow = network.cluster_flow_gbps if r["placement"] == "cluster" else network.zone_flow_gbps
        out[r["instance_type"]] = Link(host / cards, r["basis"], r["placement"], r["source"], host_gbps=host, cards=cards,
                                       flow_gbps=flow, flows=network.flows, flow_source=network.source)
    return out


told.read_traits_with(traits)  # a fact offers need of a provider not read yet has its traits read (offers/told.py)


def default_region(name: str) -> str:
    """The region a provider's stack goes to when the user names none: its `region_env` if set, else
    its declared default ("" for a provider without regions)."""
    t = traits(name)
    return (os.environ.get(t.region_env) if t.region_env else None) or t.default_region


def every() -> list[ProviderTraits]:
    return [traits(n) for n in packages()]


def names(where: Callable[[ProviderTraits], bool] | None = None) -> tuple[str, ...]:
    """The providers whose traits satisfy `where` (all of them without it), in registration order."""
    return tuple(t.name for t in every() if where is None or where(t))


# Predicates for names(where=...), named for what the caller asks.
def is_cloud(t: ProviderTraits) -> bool:
    return t.is_cloud


def has_stack(t: ProviderTraits) -> bool:
    return t.stack is not None


def has_function(t: ProviderTraits) -> bool:
    return t.function is not None


def has_catalog(t: ProviderTraits) -> bool:
    return t.catalog is not None
