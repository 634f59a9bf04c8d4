"""The model families the trainers know, and the diffusers pipeline around a family's components.

Below both models.py (which loads a model, the tiny one included) and tiny.py (which builds the
tiny one): neither needs the other to name a family or to wrap components in a pipeline.

``sd3`` is Stable Diffusion 3 and 3.5 (Medium, Large, Large Turbo): an MMDiT transformer in place
of the UNet, three text encoders (CLIP-L, CLIP-G, T5-XXL), a 16-channel VAE and a flow-matching
scheduler.
"""

from __future__ import annotations

from typing import Any

FAMILIES = ("sd15", "sd2", "sdxl", "sd3")

SD3_KEYS = ("transformer", "vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2",
            "text_encoder_3", "tokenizer_3", "scheduler")


def family_of_components(components: dict[str, Any]) -> str | None:
    """sd3 when the components hold a transformer; None: the UNet's config decides (models.py)."""
    return "sd3" if "transformer" in components else None


def pipeline(components: dict[str, Any]) -> Any:
    """A diffusers pipeline (SD, SDXL or SD3, by the components) around built or loaded components."""
    if "transformer" in components:
        from diffusers import StableDiffusion3Pipeline

        return StableDiffusion3Pipeline(**{k: components.get(k) for k in SD3_KEYS})
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

    keys = ("vae", "text_encoder", "tokenizer", "unet", "scheduler")
    if "text_encoder_2" in components:
        return StableDiffusionXLPipeline(**{k: components[k] for k in keys},
                                         text_encoder_2=components["text_encoder_2"],
                                         tokenizer_2=components["tokenizer_2"])
    return StableDiffusionPipeline(**{k: components[k] for k in keys}, safety_checker=None,
                                   feature_extractor=None, requires_safety_checker=False)
