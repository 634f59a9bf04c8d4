"""What `sdcloud speeds` shows: the figures grouped by their key, beside the catalog's."""

from __future__ import annotations

from ..offers.gpus import gpu_table
from ..offers.kinds import RunKind
from ..offers.rates import catalog_rate
from ..offers.tiers import all_tiers
from .records import OBSERVED, SpeedRow, median, reclaims_per_hour, rows


def _key(r: SpeedRow) -> tuple:
    return (r.tier, r.gpu, r.gpu_count, r.provider, r.instance_type, r.trainer, r.recipe, r.origin)


def summaries(state) -> list[dict]:
    """One entry per key and origin: the median rate, the runs (observed), last seen, the catalog's figure."""
    groups: dict[tuple, list[SpeedRow]] = {}
    found = rows(state)
    for r in found:
        groups.setdefault(_key(r), []).append(r)
    out = []
    for key, group in sorted(groups.items(), key=lambda kv: tuple(str(k) for k in kv[0])):
        tier_name, gpu, count, provider, itype, trainer, recipe, origin = key
        tier = all_tiers().get(tier_name)
        catalog = catalog_rate(tier, gpu, count) if tier is not None and gpu in gpu_table() else None
        rates = [r.rate for r in group if r.rate]
        value = median(rates)
        out.append({
            "tier": tier_name, "gpu": gpu, "gpu_count": count, "provider": provider or None,
            "instance_type": itype or None, "trainer": trainer or None, "recipe": recipe or None, "origin": origin,
            "rate": round(value, 4) if value is not None else None,
            "unit": ("images/s" if tier is not None and tier.kind is RunKind.BATCH else "steps/s"),
            "runs": len({r.run_id for r in group}) if origin == OBSERVED else None,
            "attempts": len(group) if origin == OBSERVED else None,
            "first_step_s": _median(r.first_step_s for r in group),
            "restart_s": _median(r.restart_s for r in group),
            "last_seen": max(r.time for r in group),
            "catalog_rate": round(catalog.value, 4) if catalog else None,
            "catalog_source": catalog.source if catalog else None,
            "note": next((r.note for r in reversed(group) if r.note), None),
            "ids": [r.id for r in group],
        })
    return out


def _median(values) -> float | None:
    got = median([float(v) for v in values if v is not None])
    return round(got, 3) if got is not None else None


def export(state) -> dict:
    """Every row as it is stored, and the reclaims per hour each zone showed: to keep or move elsewhere."""
    found = rows(state)
    return {"rows": [r.as_dict() for r in found], "reclaims_per_hour": reclaims_per_hour(found)}
