"""The figures that take the catalog's place in the optimizer (offers/rates.RateBook).

Which figure wins, most trusted first:
  1. observed on the same provider and instance type: the median of its attempts' steady rates;
  2. observed on the same GPU on any host;
  3. recorded for the provider and instance type, then recorded for the GPU (the newest).
Only figures of the tier's own model count (an attempt on the tiny test model says nothing of SDXL),
and a figure of another trainer counts only when no trainer is asked for (`sdcloud offers`).
A rate measured with N GPUs is brought to the host's GPU count by the multi-GPU speed-up.
"""

from __future__ import annotations

from ..offers.gpus import multi_gpu_speedup
from ..offers.rates import Rate, catalog_rate
from ..offers.tiers import Tier
from .records import OBSERVED, RECORDED, SpeedRow, median, rows

# How far the catalog's figure may be from what runs observed before `offers` says so.
CATALOG_GAP = 0.25


def _runs(found: list[SpeedRow]) -> int:
    return len({r.run_id for r in found})


class Book:
    def __init__(self, found: list[SpeedRow], trainer: str | None = None):
        self.rows = [r for r in found if r.rate and r.rate > 0 and r.recipe == ""
                     and (trainer is None or r.trainer in ("", trainer))]
        # Every observed attempt, with a rate or without: its spot hours and reclaims, its restart.
        self.attempts = [r for r in found if r.origin == OBSERVED]

    def reclaims(self, provider: str, zone: str, region: str = "") -> tuple[int, float] | None:
        """(reclaims, spot hours) that runs observed in the zone (records.reclaims_per_hour's rows), or,
        for an offer of a whole region (a catalog row without a zone), in the zones of that region
        (a zone is named after its region: us-east-1a, ap-guangzhou-3); None where no spot hour was."""
        def here(z: str) -> bool:
            return z == zone if zone else bool(region) and z.startswith(region)

        found = [r for r in self.attempts if r.market == "spot" and r.hours and r.provider == provider
                 and r.zone and here(r.zone)]
        hours = sum(float(r.hours or 0.0) for r in found)
        return (sum(int(r.reclaimed) for r in found), hours) if hours > 0 else None

    def restart_seconds(self, tier: Tier, provider: str) -> tuple[float, int] | None:
        """(median seconds, attempts) from a launch after a reclaim to the first trained step, as the
        tier's own model restarted on the provider's hosts; None where none was observed."""
        found = [r.restart_s for r in self.attempts if r.restart_s and r.tier == tier.name and r.recipe == ""
                 and r.provider == provider]
        value = median([float(v) for v in found])
        return None if value is None else (value, len(found))

    def _per_gpu(self, r: SpeedRow, kind: str) -> float:
        return float(r.rate or 0.0) / multi_gpu_speedup(r.gpu_count, kind)

    def observed(self, tier: Tier, gpu: str, provider: str = "", instance_type: str = "") -> tuple[float, int] | None:
        """(median rate of one GPU, runs) observed for the tier on `gpu` (on that host where given)."""
        found = [r for r in self.rows if r.origin == OBSERVED and r.tier == tier.name and r.gpu == gpu
                 and (not instance_type or (r.provider, r.instance_type) == (provider, instance_type))]
        value = median([self._per_gpu(r, tier.kind) for r in found])
        return None if value is None else (value, _runs(found))

    def rate(self, tier: Tier, provider: str, instance_type: str, gpu: str, gpus_used: int) -> Rate | None:
        scale = multi_gpu_speedup(gpus_used, tier.kind)
        for where in ((provider, instance_type), ("", "")):
            got = self.observed(tier, gpu, *where)
            if got is not None:
                value, runs = got
                return Rate(value * scale, f"observed: {runs} run{'s' if runs != 1 else ''}", OBSERVED)
        recorded = [r for r in self.rows if r.origin == RECORDED and r.tier == tier.name and r.gpu == gpu
                    and r.provider in ("", provider) and r.instance_type in ("", instance_type)]
        if recorded:
            best = max(recorded, key=lambda r: (bool(r.instance_type), bool(r.provider), r.time, r.id))
            note = f" ({best.note})" if best.note else ""
            return Rate(self._per_gpu(best, tier.kind) * scale, f"recorded{note}", RECORDED)
        return None

    def catalog_gaps(self, tier: Tier, gpus: list[str]) -> list[str]:
        """One line for each GPU whose catalog figure is off by more than CATALOG_GAP from what runs observed."""
        lines = []
        for gpu in sorted(set(gpus)):
            got, catalog = self.observed(tier, gpu), catalog_rate(tier, gpu)
            if got is None or catalog is None:
                continue
            value, runs = got
            off = catalog.value / value - 1.0
            if abs(off) > CATALOG_GAP:
                lines.append(f"the catalog's {tier.name} rate on {gpu} ({catalog.value:.3g}/s) is {abs(off):.0%} "
                             f"{'above' if off > 0 else 'below'} the {value:.3g}/s observed in {runs} "
                             f"run{'s' if runs != 1 else ''}; offers use the observed figure")
        return lines


def load_book(state, trainer: str | None = None) -> Book:
    return Book(rows(state), trainer)
