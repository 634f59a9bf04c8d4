"""Whether a rate the user records is one the GPU could give (`sdcloud speeds add`).

A recorded figure takes the catalog's place in every ranking (offers, the run's choice of host), so a
typo there (1e-300, 5000 steps/s SDXL on a T4) would rank every host by nonsense. The catalog's rate
model (offers/rates.py) gives the tier's figure on that GPU; measured rates differ from it by a
trainer's, a recipe's or a batch size's worth (a few times at most), never by orders of magnitude.
"""

from __future__ import annotations

from ..errors import UserError

# A figure this many times off the model is asked about (--force keeps it): a real difference, or a typo.
ASK_FACTOR = 10.0
# Beyond this, no trainer or recipe explains it: refused even with --force.
REFUSE_FACTOR = 1000.0


def check_figure(gpu: str, tier_name: str, rate: float, force: bool = False) -> None:
    """UserError (one line) for a rate the tier cannot have on `gpu`: a GPU whose memory is below the
    tier's floor, a figure beyond REFUSE_FACTOR of the model's, or beyond ASK_FACTOR without `force`."""
    from ..offers.rates import gpu_rate
    from ..offers.tiers import get_tier

    tier = get_tier(tier_name)
    if gpu not in tier.gpus_fit():
        raise UserError(f"{tier.name} needs {tier.min_vram_gb:g} GB of GPU memory; a {gpu} cannot run it "
                        f"(GPUs that can: {', '.join(tier.gpus_fit())})")
    model = gpu_rate(tier, gpu)
    if model is None:  # a GPU the model does not know: nothing to hold the figure to
        return
    off = max(rate / model, model / rate)
    unit = f"{tier.unit}/s"
    why = f"{rate:g} {unit} is {off:.3g}x the catalog's model figure for {tier.name} on a {gpu} ({model:.3g} {unit})"
    if off > REFUSE_FACTOR:
        raise UserError(f"{why}: no trainer or recipe is that far off; check the figure and its unit ({unit} per GPU)")
    if off > ASK_FACTOR and not force:
        raise UserError(f"{why}: if it is right (another recipe, another batch size), add --force to keep it")
