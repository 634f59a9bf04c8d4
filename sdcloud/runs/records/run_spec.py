"""A training run's spec and its plan, as the run's row stores them and every layer of runs/ reads them.

They sit with the records (the bottom of runs/: inputs build them, driving acts on them, records
store and read them back); runs/inputs/spec.py builds and checks them and is where callers import them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ...offers.tiers import Tier, get_tier
from ...providers.traits import ProviderTraits, traits


@dataclass
class RunSpec:
    tier: str
    provider: str = "local"
    market: str = "spot"  # "spot" or "on-demand"
    max_price: float | None = None  # USD per hour
    region: str | None = None
    deadline_hours: float | None = None
    budget: float | None = None  # USD
    name: str | None = None
    dataset: str | None = None
    trainer: str = "builtin"
    # A mapping of flags (kept whole, keys and values) or an argv list (builtin, command).
    trainer_args: Any = field(default_factory=list)
    model: str | None = None  # None: tiny on local/ssh, the tier's base_model on paid providers
    steps: int | None = None
    checkpoint_every: int | None = None
    simulate_preemption: float | None = None  # seconds after the first attempt's first step (local provider)
    store: str | None = None  # bucket URL override, e.g. s3://bucket/prefix or file:///dir
    max_failed_boots: int | None = None  # failed boots in a row that end the run (default 3)
    # Seconds a host waits for the controller after its last phase before it ends itself (None:
    # config.toml's [hosts] self_end_grace, else 10 minutes; docs/runs.md).
    self_end_grace: float | None = None
    # Where this run's hosts get outside things, over the region's profile and config.toml
    # (sdcloud/runs/inputs/network.py): pip_index_url, hf_endpoint, torch_index_url, trainer_sources.
    network: dict | None = None
    nodes: int = 1  # hosts trained on together, data-parallel through the rendezvous (docs/training.md)
    # Every cloud the run may use, home first (`--provider aws,tencent`); None: `provider` alone.
    # `provider` is the cloud of the current attempt (runs/inputs/clouds.py, runs/driving/placement.py).
    providers: list[str] | None = None
    # Sample images at the checkpoints (docs/training.md, "Samples and curves"): the prompts, every N
    # steps (None: at every checkpoint) and the first seed (None: 0; prompt i renders with seed + i).
    sample_prompts: list[str] | None = None
    sample_every: int | None = None
    sample_seed: int | None = None
    # Where the trainer also logs its curves: "tensorboard" (always, in the run's store) or "wandb"
    # (its key from config.toml [wandb] key, carried as a secret).
    report_to: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RunPlan:
    """A run's spec with its names resolved once: the `Tier` object, the provider's traits, and the
    budget (USD) and max price (USD per hour) as money.usd checked them when the spec was built."""

    spec: RunSpec
    tier: Tier
    traits: ProviderTraits

    @property
    def budget(self) -> float | None:
        return self.spec.budget

    @property
    def max_price(self) -> float | None:
        return self.spec.max_price

    def as_dict(self) -> dict:
        """The spec as the run row stores it (the plan's resolved parts are resolved again on reading)."""
        return self.spec.as_dict()

    @classmethod
    def of(cls, spec: RunSpec) -> "RunPlan":
        return cls(spec, get_tier(spec.tier), traits(spec.provider))

    @classmethod
    def of_run(cls, run: dict) -> "RunPlan":
        """The plan of a training run's row (the boundary where a stored spec is read back)."""
        return cls.of(RunSpec(**run["spec"]))
