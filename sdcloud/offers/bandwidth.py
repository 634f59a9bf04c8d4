"""A marketplace machine's bytes and disk in the cost to finish (MarketRules.bandwidth_priced: Vast.ai).

Each machine prices the bytes it sends and receives per GB, and its disk per GB-month while the
instance exists (running or paused). A run's bytes, per attempt (assumptions, docs/offers.md):
  down  the base model (the family's weights in fp16 as the hub serves them) + the dataset (1 GB)
        + a restored checkpoint (as big as one upload);
  up    each checkpoint uploaded (a LoRA ~0.2 GB; a full UNet or transformer: the model's size),
        one per CHECKPOINT_INTERVAL_HOURS of the job, plus the final one.
Disk: DISK_GB for the job's hours. GB here is 10^9 bytes, as the marketplace prices them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .tiers import Tier

# The base model's download per family, GB (the hub's fp16 safetensors: SD1.5 2.1, SDXL 6.9, SD3.5 M/L ~5-16).
MODEL_GB = {"sd15": 2.1, "sd2": 2.6, "sdxl": 6.9, "sd3": 11.0}
DATASET_GB = 1.0
LORA_GB = 0.2
DISK_GB = 60.0  # the container disk asked for a training run (the model, the dataset, a few checkpoints)
HOURS_PER_MONTH = 730.0


@dataclass(frozen=True)
class Bandwidth:
    down_gb: float
    up_gb: float
    transfer_usd: float
    storage_usd: float

    @property
    def usd(self) -> float:
        return self.transfer_usd + self.storage_usd

    def as_dict(self) -> dict:
        return {"download_gb": round(self.down_gb, 2), "upload_gb": round(self.up_gb, 2),
                "transfer_usd": round(self.transfer_usd, 4), "storage_usd": round(self.storage_usd, 4),
                "disk_gb": DISK_GB}


def bandwidth(tier: Tier, row, hours: float, checkpoint_hours: float) -> Bandwidth | None:
    """The transfer and disk charges of one run of `hours` on `row`; None where the row prices no bytes."""
    if not row.bandwidth_priced:
        return None
    model = MODEL_GB.get(tier.family, MODEL_GB["sdxl"])
    checkpoint = LORA_GB if tier.mode == "lora" else model
    saves = int(hours / checkpoint_hours) + 1 if checkpoint_hours > 0 else 1
    down = model + DATASET_GB + checkpoint
    up = checkpoint * saves
    transfer = down * row.download_usd_per_gb + up * row.upload_usd_per_gb
    storage = DISK_GB * row.storage_usd_per_gb_month / HOURS_PER_MONTH * hours
    return Bandwidth(down, up, transfer, storage)
