"""The model families the trainers know, and the diffusers pipeline around a family's components.

Below both models.py (which loads a model, the tiny one included) and tiny.py (which builds the
tiny one): neither needs the other to name a family or to wrap components in a pipeline.
"""

from __future__ import annotations

from typing import Any

FAMILIES = ("sd15", "sd2", "sdxl")


def pipeline(components: dict[str, Any]) -> Any:
    """A diffusers pipeline (SD or SDXL, by the components) around built or loaded components."""
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

    keys = ("vae", "text_encoder", "tokenizer", "unet", "scheduler")
    if "text_encoder_2" in components:
        return StableDiffusionXLPipeline(**{k: components[k] for k in keys},
                                         text_encoder_2=components["text_encoder_2"],
                                         tokenizer_2=components["tokenizer_2"])
    return StableDiffusionPipeline(**{k: components[k] for k in keys}, safety_checker=None,
                                   feature_extractor=None, requires_safety_checker=False)
