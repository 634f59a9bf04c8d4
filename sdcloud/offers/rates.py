"""How fast a tier's job runs on one GPU: the catalog's figure (steps/s, or images/s for batch tiers).

Batch generation scales with the GPU's inference figure (sdcloud/data/gpus.csv): measured against
the model within a few percent. Training does not: at batch 1 a step is bound by per-step work that
a faster GPU hardly shortens, so a training step is a fixed share of the reference (A10G) step plus
the rest divided by the GPU's compute speed, the share calibrated per tier on measured and published
figures (sdcloud/data/train_rates.toml; docs/offers.md, "Training rates").

A figure the user recorded or a run observed (sdcloud/speeds) takes the catalog's place in the
optimizer; this module is the catalog's side only.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Protocol

from .gpus import gpu_table, multi_gpu_speedup
from .kinds import RunKind
from .tiers import Tier, all_tiers

FIGURE_BASES = ("measured", "published")


@dataclass(frozen=True)
class Rate:
    """A rate on one host, before reclaims and start-up, and where it comes from."""

    value: float  # steps/s (train) or images/s (batch) on the whole host
    source: str  # one line: "model: ...", "inference: ...", "recorded", "observed: N runs"
    origin: str = "catalog"  # catalog, recorded or observed


@lru_cache(maxsize=1)
def rate_data() -> dict:
    """sdcloud/data/train_rates.toml: the training figures and which one each tier is calibrated on."""
    return tomllib.loads(resources.files("sdcloud").joinpath("data/train_rates.toml").read_text())


def figure_gpu(figure: dict) -> str:
    """The GPU of gpus.csv a figure stands for (an H200's figure stands for an H100)."""
    return str(figure.get("as_gpu") or figure["gpu"])


def _share_from(tier: Tier, figure: dict) -> float:
    """The overhead share that makes the model give `figure` exactly on its GPU."""
    rel = gpu_table()[figure_gpu(figure)].infer_rel
    measured = (1.0 / float(figure["rate"])) / (1.0 / tier.ref_rate)  # step time against the reference's
    if rel == 1.0:
        raise ValueError(f"train_rates.toml: a figure on the reference GPU cannot calibrate {tier.name}'s share")
    share = (measured - 1.0 / rel) / (1.0 - 1.0 / rel)
    return min(max(share, 0.0), 0.95)


@lru_cache(maxsize=None)
def overhead_share(tier_name: str) -> tuple[float, str]:
    """(share of the reference step that a faster GPU does not shorten, which figure it comes from)."""
    tiers = all_tiers()
    model = rate_data()["model"].get(tier_name)
    if model is None:
        return 0.0, "no training figure: scaled from inference"
    if "calibrate" in model:
        name = model["calibrate"]
        return _share_from(tiers[tier_name], rate_data()["figures"][name]), name
    share, name = overhead_share(model["like"])
    return share, name


def gpu_rate(tier: Tier, gpu: str, batch_size: int | None = None) -> float | None:
    """The tier's rate on one `gpu` (steps/s or images/s); None for a GPU gpus.csv does not know.

    `batch_size`: the batch the trainer runs (None: the tier's). The compute part of a step grows
    with the batch; the per-step overhead does not."""
    perf = gpu_table().get(gpu)
    if perf is None:
        return None
    if tier.kind is RunKind.BATCH:
        return tier.ref_rate * perf.infer_rel
    share, _ = overhead_share(tier.name)
    scale = (batch_size or tier.batch_size) / tier.batch_size
    step = (1.0 / tier.ref_rate) * (share + (1.0 - share) * scale / perf.infer_rel)
    return 1.0 / step


def catalog_rate(tier: Tier, gpu: str, gpus_used: int = 1) -> Rate | None:
    """The catalog's rate of a host that drives `gpus_used` of `gpu`; None for an unknown GPU."""
    one = gpu_rate(tier, gpu)
    if one is None:
        return None
    return Rate(one * multi_gpu_speedup(gpus_used, tier.kind), catalog_source(tier, gpu))


def catalog_source(tier: Tier, gpu: str) -> str:
    """Where the catalog's figure for `tier` on `gpu` comes from, in one line."""
    perf = gpu_table().get(gpu)
    compute = perf.speed_source() if perf else "unknown GPU"
    if tier.kind is RunKind.BATCH:
        return f"inference: {compute}"
    share, name = overhead_share(tier.name)
    if name not in rate_data()["figures"]:
        return f"model: {name}; compute {compute}"
    model = rate_data()["model"].get(tier.name, {})
    via = f" (as {model['like']})" if "like" in model else ""
    return f"model: {share:.0%} step overhead from {name}{via}; compute {compute}"


class RateBook(Protocol):
    """Figures that take the catalog's place: recorded by the user or observed by runs (sdcloud/speeds)."""

    def rate(self, tier: Tier, provider: str, instance_type: str, gpu: str, gpus_used: int) -> Rate | None:
        """The rate of a host that drives `gpus_used` GPUs, or None where nothing was recorded or observed."""
        ...


def host_rate(tier: Tier, provider: str, instance_type: str, gpu: str, gpus_used: int,
              book: RateBook | None = None) -> Rate | None:
    """The rate the optimizer uses for one host: the book's where it has one, else the catalog's."""
    if book is not None:
        got = book.rate(tier, provider, instance_type, gpu, gpus_used)
        if got is not None:
            return got
    return catalog_rate(tier, gpu, gpus_used)
