"""The builtin trainer's memory recipe: which savings a GPU needs for a family, mode and resolution.

Chosen on the host from the GPU's usable VRAM (total minus what the CUDA context and allocator
keep), from the least saving that fits: every saving costs speed (gradient checkpointing about a
quarter, 8-bit AdamW little, Adafactor some convergence). Latents and text embeddings are always
cached once (the trainer encodes the dataset before training and moves the encoders off the GPU).

The VRAM thresholds follow the tiers' floors in sdcloud/data/tiers.toml and the public figures they
cite (diffusers' LoRA/DreamBooth READMEs, kohya sd-scripts' SDXL docs); bench/train_gpu.py measures
each recipe's peak on a real GPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# GB the CUDA context, cuDNN workspaces and fragmentation take from the card's total.
RESERVED_GB = 1.5


@dataclass(frozen=True)
class Recipe:
    gradient_checkpointing: bool
    optimizer: str  # adamw, adamw8bit or adafactor
    max_batch: int  # per micro-batch; a larger batch becomes gradient accumulation

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        parts = ["gradient checkpointing" if self.gradient_checkpointing else "no checkpointing",
                 self.optimizer, f"micro-batch <= {self.max_batch}"]
        return ", ".join(parts)


# (family, mode) -> [(min usable GB at the reference resolution, recipe)], most VRAM first.
# Reference resolutions: 512 for sd15/sd2, 1024 for sdxl; memory scales about with pixel count.
TABLE: dict[tuple[str, str], list[tuple[float, Recipe]]] = {
    ("sd15", "lora"): [(20, Recipe(False, "adamw", 8)), (14, Recipe(False, "adamw", 2)),
                       (0, Recipe(True, "adamw8bit", 1))],
    ("sd15", "dreambooth"): [(36, Recipe(False, "adamw", 4)), (22, Recipe(True, "adamw", 2)),
                             (0, Recipe(True, "adamw8bit", 1))],
    ("sdxl", "lora"): [(40, Recipe(False, "adamw", 4)), (22, Recipe(True, "adamw", 2)),
                       (0, Recipe(True, "adamw8bit", 1))],
    ("sdxl", "dreambooth"): [(75, Recipe(True, "adamw", 2)), (44, Recipe(True, "adamw8bit", 1)),
                             (0, Recipe(True, "adafactor", 1))],
    # SD3.5 (estimates; the text encoders are cached and off the GPU): the Medium transformer is
    # about SDXL's UNet in size; Large (8B) needs the lower rows, which its tier's floor allows.
    ("sd3", "lora"): [(60, Recipe(False, "adamw", 2)), (30, Recipe(True, "adamw", 1)),
                      (0, Recipe(True, "adamw8bit", 1))],
    ("sd3", "dreambooth"): [(75, Recipe(True, "adamw", 1)), (44, Recipe(True, "adamw8bit", 1)),
                            (0, Recipe(True, "adafactor", 1))],
}
REFERENCE_RES = {"sd15": 512, "sd2": 512, "sdxl": 1024, "sd3": 1024}


def choose(family: str, mode: str, resolution: int, usable_gb: float) -> Recipe:
    """The least-saving recipe whose threshold (scaled to this resolution) fits usable_gb."""
    fam = "sd15" if family == "sd2" else family
    rows = TABLE[(fam, mode)]
    scale = (resolution / REFERENCE_RES[family]) ** 2
    for need, recipe in rows:
        if usable_gb >= need * scale:
            return recipe
    return rows[-1][1]


def usable_vram_gb(torch, device) -> float:
    _free, total = torch.cuda.mem_get_info(device)
    return total / 2**30 - RESERVED_GB
