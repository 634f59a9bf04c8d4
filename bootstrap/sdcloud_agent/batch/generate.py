"""Image generation with diffusers on the host: one pipeline, loaded once, reused for every item.

Precision follows the trainer: bf16 on CUDA where supported, else fp16 on CUDA, fp32 on a CPU.
Attention is PyTorch SDPA; UNet and VAE run channels_last. The batch size comes from usable VRAM.
`torch.compile` and VAE tiling are opt-in (compile pays off over long jobs; tiling for large sizes).
A reclaim notice (the abort flag) interrupts the denoising loop at the next step: the batch is
abandoned, nothing of it is written, and the worker releases its lease.
"""

from __future__ import annotations

import io
import os
import threading
from typing import Any

SCHEDULERS = {"ddim": "DDIMScheduler", "euler": "EulerDiscreteScheduler", "euler_a": "EulerAncestralDiscreteScheduler",
              "dpmpp_2m": "DPMSolverMultistepScheduler", "pndm": "PNDMScheduler", "lms": "LMSDiscreteScheduler",
              "flow_euler": "FlowMatchEulerDiscreteScheduler"}  # SD3 / SD3.5
GiB = 1024 ** 3
# Activation memory per image in a half-precision batch at the family's native size, measured loosely
# from diffusers' memory guidance; scaled by pixel count for other sizes. Conservative on purpose.
PER_IMAGE_BYTES = {"sd15": int(1.0 * GiB), "sdxl": int(2.5 * GiB), "sd3": int(3.0 * GiB)}
NATIVE_PIXELS = {"sd15": 512 * 512, "sdxl": 1024 * 1024, "sd3": 1024 * 1024}
FAMILY_OF_TIER = {"batch-sdxl": "sdxl", "batch-sd35": "sd3"}  # else sd15
MAX_BATCH = 8


def choose_dtype(torch: Any, device: str) -> Any:
    if device != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def batch_size_for(free_bytes: int | None, family: str, width: int, height: int) -> int:
    """How many images fit in one pipeline call: free VRAM after the weights, over per-image activations."""
    if free_bytes is None:  # a CPU: small batches keep a reclaim notice cheap to honour
        return 2
    per = PER_IMAGE_BYTES[family] * max(1.0, width * height / NATIVE_PIXELS[family])
    return max(1, min(MAX_BATCH, int(free_bytes * 0.8 // per)))


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".ckpt", ".pt", ".pth")


def _check_weights(model: str) -> None:
    """A model folder without a weights file anywhere in it cannot load: say so at once (the worker
    exits non-zero with this line, as it would after loading torch and diffusers to find out)."""
    if not os.path.isdir(model):
        return
    for _, _, files in os.walk(model):
        if any(f.endswith(WEIGHT_SUFFIXES) for f in files):
            return
    raise SystemExit(f"the model folder {model} holds no weights file ({', '.join(WEIGHT_SUFFIXES)})")


class DiffusersGenerator:
    def __init__(self, pipe: Any, family: str, device: str, compile_unet: bool = False, vae_tiling: bool = False):
        import torch
        from diffusers.models.attention_processor import AttnProcessor2_0

        self.torch, self.pipe, self.family, self.device = torch, pipe, family, device
        if family == "sd3":
            net = pipe.transformer  # keeps its own joint-attention processor (SDPA)
        else:
            net = pipe.unet
            net.set_attn_processor(AttnProcessor2_0())
            net.to(memory_format=torch.channels_last)
        pipe.vae.to(memory_format=torch.channels_last)
        if vae_tiling:
            pipe.vae.enable_tiling()
        if compile_unet:
            compiled = torch.compile(net, fullgraph=False)
            if family == "sd3":
                pipe.transformer = compiled
            else:
                pipe.unet = compiled
        pipe.set_progress_bar_config(disable=True)
        self._schedulers: dict[str, Any] = {}
        self._base_config = pipe.scheduler.config
        self.batch_size = 2
        self._sized: tuple[int, int] | None = None

    @classmethod
    def from_job(cls, job: dict[str, Any], compile_unet: bool = False, vae_tiling: bool = False) -> "DiffusersGenerator":
        _check_weights(job["model"])  # before torch and diffusers: seconds of imports to learn nothing
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu" and os.environ.get("SDCLOUD_CPU_THREADS"):
            torch.set_num_threads(int(os.environ["SDCLOUD_CPU_THREADS"]))  # several workers on one machine
        dtype = choose_dtype(torch, device)
        family = FAMILY_OF_TIER.get(job.get("tier"), "sd15")
        model = job["model"]
        if family == "sd3":
            # SD3 / SD3.5: the transformer, three text encoders (T5 included), a 16-channel VAE.
            from diffusers import StableDiffusion3Pipeline

            if model == "tiny":
                from ..trainers import tiny

                pipe = StableDiffusion3Pipeline(**tiny.build_components(family="sd3"))
            else:
                pipe = StableDiffusion3Pipeline.from_pretrained(model, torch_dtype=dtype)
        elif model == "tiny" and family == "sdxl":
            # Random weights in SDXL's shape: two text encoders (the second pooled), text_time conditioning.
            from diffusers import StableDiffusionXLPipeline

            from ..trainers import tiny

            pipe = StableDiffusionXLPipeline(**tiny.build_components(family="sdxl"), add_watermarker=False)
        elif model == "tiny":
            from diffusers import StableDiffusionPipeline

            from ..trainers import tiny

            pipe = StableDiffusionPipeline(**tiny.build_components(), safety_checker=None, feature_extractor=None,
                                           requires_safety_checker=False)
        else:
            from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

            kind = StableDiffusionXLPipeline if family == "sdxl" else StableDiffusionPipeline
            pipe = kind.from_pretrained(model, torch_dtype=dtype)
        pipe.to(device, dtype)
        if job.get("lora"):
            pipe.load_lora_weights(job["lora"])
        return cls(pipe, family, device, compile_unet, vae_tiling)

    def _scheduler(self, name: str) -> Any:
        if name not in self._schedulers:
            import diffusers

            self._schedulers[name] = getattr(diffusers, SCHEDULERS[name]).from_config(self._base_config)
        return self._schedulers[name]

    def _size_batch(self, width: int, height: int) -> None:
        if self._sized == (width, height):
            return
        free = None
        if self.device == "cuda":
            free, _total = self.torch.cuda.mem_get_info()
        self.batch_size = batch_size_for(free, self.family, width, height)
        self._sized = (width, height)

    def generate(self, settings: dict[str, Any], seeds: list[int], abort: threading.Event) -> list[bytes] | None:
        torch = self.torch
        self._size_batch(int(settings["width"]), int(settings["height"]))
        self.pipe.scheduler = self._scheduler(settings.get("scheduler") or "ddim")
        gens = [torch.Generator(self.device).manual_seed(int(s)) for s in seeds]

        def on_step(pipe: Any, step: int, timestep: Any, kwargs: dict) -> dict:
            if abort.is_set():
                pipe._interrupt = True  # diffusers stops the denoising loop at the next step
            return kwargs
        n = len(seeds)
        with torch.inference_mode():
            out = self.pipe(prompt=[settings["prompt"]] * n, negative_prompt=[settings.get("negative_prompt") or ""] * n,
                            num_inference_steps=int(settings["steps"]), guidance_scale=float(settings["guidance"]),
                            width=int(settings["width"]), height=int(settings["height"]), generator=gens,
                            callback_on_step_end=on_step)
        if abort.is_set():
            return None
        pngs = []
        for img, seed in zip(out.images, seeds):
            from PIL.PngImagePlugin import PngInfo

            info = PngInfo()
            info.add_text("prompt", settings["prompt"])
            info.add_text("seed", str(seed))
            buf = io.BytesIO()
            img.save(buf, format="PNG", pnginfo=info)
            pngs.append(buf.getvalue())
        return pngs
