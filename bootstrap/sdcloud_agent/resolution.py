"""The model's own training resolution, decided on the host once the model is on disk.

The control plane may never see the model (a hub id fetched by the host), so it sends the tier's
resolution as a fallback and `resolution_from_model: true` when the user did not choose one. The
agent then reads the model's diffusers config and replaces the fallback with the resolution the
model was trained at: the UNet's `sample_size` (in latent pixels) times the VAE's scale factor
`2 ** (len(vae.block_out_channels) - 1)`, which is how diffusers' own pipelines pick their default
height and width (diffusers pipeline_stable_diffusion.py: `vae_scale_factor` and the `height`
docstring, "defaults to self.unet.config.sample_size * self.vae_scale_factor"). That gives 512 for
SD 1.5 (64 x 8), 768 for SD 2.x 768-v (96 x 8), 1024 for SDXL and its derivatives (128 x 8) and
32 for the tests' tiny pipelines. A single-file checkpoint or a hub id that is not on disk keeps
the tier's figure.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("sdcloud_agent")


def of_model(model: str | Path) -> int | None:
    """The model's native resolution from its diffusers folder, or None when it does not say."""
    root = Path(model)
    # SD3's transformer states its latent sample_size as the UNet does (128 for 1024 px).
    net = root / "unet" / "config.json"
    if not net.is_file():
        net = root / "transformer" / "config.json"
    try:
        unet = json.loads(net.read_text())
        vae = json.loads((root / "vae" / "config.json").read_text())
    except (OSError, ValueError):
        return None
    size = unet.get("sample_size")
    if isinstance(size, (list, tuple)) and size:
        size = size[0]  # (height, width) in some configs; training is square here
    blocks = vae.get("block_out_channels")
    if not isinstance(size, int) or size <= 0 or not isinstance(blocks, (list, tuple)) or not blocks:
        return None
    return size * 2 ** (len(blocks) - 1)


def with_resolution(trainer: str, args: Any, res: int) -> Any:
    """trainer_args with the resolution set in the trainer's own form: kohya takes "W,H", the
    builtin trainer and the diffusers scripts one side; an argv list keeps its order."""
    value: Any = f"{res},{res}" if trainer == "kohya" else res
    if isinstance(args, dict):
        key = next((k for k in args if str(k).lstrip("-") == "resolution"), "resolution")
        return {**args, key: value}
    out = [str(a) for a in (args or [])]
    for i, a in enumerate(out):
        if a == "--resolution" and i + 1 < len(out):
            out[i + 1] = str(value)
            return out
        if a.startswith("--resolution="):
            out[i] = f"--resolution={value}"
            return out
    return [*out, "--resolution", str(value)]


def settle(trainer: str, args: Any, model: str | Path) -> Any:
    """The run's trainer_args with the model's own resolution over the tier's fallback."""
    res = of_model(model)
    if res is None:
        log.info("resolution: the model's config does not say (%s); the tier's figure stays", model)
        return args
    log.info("resolution: %d px from the model's config (UNet sample size x VAE scale factor)", res)
    return with_resolution(trainer, args, res)
