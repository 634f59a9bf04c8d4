"""A run's deadline and budget weighed against the catalog before anything is made (`sdcloud up`):
a region the catalog does not know, a deadline shorter than the fastest offer's estimate, or a budget
under the whole job's predicted cost is refused in one line."""

from __future__ import annotations

from ...errors import UserError


def check_estimates(spec, tier, total_steps: int) -> None:
    """Refuse a region the catalog does not know, and a deadline or budget that no offer can meet,
    before anything is launched (and before credentials are asked for)."""
    from ...providers.traits import traits

    if not traits(spec.provider).catalog:
        return
    from ...offers.catalog import load_catalog
    from ...offers import groups, optimizer  # groups: a run of N hosts is ranked as a group

    catalog = load_catalog([spec.provider])
    if spec.region is not None:
        optimizer.check_region(catalog.rows, spec.region, spec.provider)
    if spec.deadline_hours is None and spec.budget is None:
        return

    market = None if spec.market == "spot" else "on-demand"
    from ..records.books import user_book
    from .training import gpus_used

    # The rates recorded and observed here take the catalog's place, as in `offers`.
    ranked = groups.rank_job(tier, catalog, spec.nodes, total_steps, market=market, max_price=spec.max_price,
                             provider=spec.provider, region=spec.region, gpus_used=gpus_used(spec),
                             book=user_book(spec.trainer))
    if not ranked:
        raise UserError(f"no {spec.provider} offer fits tier {tier.name}")
    if spec.deadline_hours is not None:
        fastest = min(ranked, key=lambda e: e.est_hours)
        if spec.deadline_hours < fastest.est_hours:
            raise UserError(f"deadline {spec.deadline_hours:g} h is shorter than the fastest estimate, "
                            f"{fastest.est_hours:.2f} h on {fastest.offer.row.instance_type} ({fastest.offer.market})")
    if spec.budget is not None:
        from ...costs.budget import predict

        # The whole job: expected reclaims, the disk, and the on-demand fallback a deadline may force.
        predicted, what = predict(ranked, spec.market, spec.deadline_hours)
        if spec.budget < predicted:
            raise UserError(f"budget ${spec.budget:g} is below the predicted cost of the whole job, "
                            f"${predicted:.2f} on {what}")
