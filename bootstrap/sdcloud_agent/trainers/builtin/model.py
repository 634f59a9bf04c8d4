"""The model side of training: loading the base model, the memory recipe of the GPU (recipes.py),
the captions encoded once, the LoRA or full-UNet parameters and their optimizer.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from .data import folder_images, make_buckets, synthetic_images
from .protocol import UsageError, log
from .sd3 import LORA_TARGETS_SD3, SD3Setup


LORA_TARGETS = ["to_k", "to_q", "to_v", "to_out.0"]


def auto_precision(torch: Any, device: Any) -> str:
    """bf16 where the GPU computes it natively (compute capability 8.x and later: A10G, A100, L4,
    H100); fp16 with a loss scaler below (T4, V100). torch.cuda.is_bf16_supported() says yes on
    T4/V100 too (emulated, slow), so the capability decides."""
    if device.type != "cuda":
        return "no"
    major, _ = torch.cuda.get_device_capability(device)
    return "bf16" if major >= 8 else "fp16"


def make_optimizer(args: argparse.Namespace, params: list[Any], device: Any) -> Any:
    import torch

    if args.optimizer == "adamw8bit":
        if device.type != "cuda":
            raise UsageError("--optimizer adamw8bit needs CUDA (bitsandbytes)")
        try:
            import bitsandbytes as bnb
        except ImportError:
            raise UsageError("--optimizer adamw8bit needs the bitsandbytes package") from None
        return bnb.optim.AdamW8bit(params, lr=args.lr, betas=(0.9, 0.999), weight_decay=1e-2,
                                   eps=1e-8)
    if args.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        # A fixed learning rate (the LR scheduler drives it), as for the other optimizers.
        return Adafactor(params, lr=args.lr, relative_step=False, scale_parameter=False,
                         warmup_init=False, weight_decay=1e-2)
    return torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8)


class ModelSetup(SD3Setup):
    def _load_model(self) -> None:
        from .. import models

        args = self.args
        want = args.families
        try:
            c = models.load_components(args.model, family=want[0] if want else None,
                                       resolution=args.resolution, config=args.model_config)
        except models.ModelError as exc:
            raise UsageError(str(exc)) from None
        self.family = models.family_of(c)
        if want and self.family not in want:
            raise UsageError(f"--model {args.model} is an {self.family} model; this run trains "
                             f"{' or '.join(want)} (pick a model of that family or another tier)")
        self.components = c
        self.text_encoder_3 = None
        if self.family == "sd3":
            self._sd3_adopt(c)  # the transformer in the UNet's place (sd3.py)
        else:
            self.unet, self.vae, self.text_encoder = c["unet"], c["vae"], c["text_encoder"]
            self.tokenizer, self.noise_scheduler = c["tokenizer"], c["scheduler"]
            self.text_encoder_2, self.tokenizer_2 = c.get("text_encoder_2"), c.get("tokenizer_2")
        if args.prediction_type != "auto" and self.family != "sd3":
            self.noise_scheduler.register_to_config(prediction_type=args.prediction_type)
        # The frozen parts stay fp32: the VAE of SDXL overflows in fp16 (NaN latents), and they
        # run once per image (the cache), so their precision costs nothing per step.
        for m in self.frozen():
            m.requires_grad_(False)
            m.eval()
            m.to(self.device, dtype=self.torch.float32)
        self.unet.to(self.device)
        vae_f = 2 ** (len(self.vae.config.block_out_channels) - 1)
        if self.family == "sd3":
            self.pixel_multiple = self._sd3_pixel_multiple()
        else:
            unet_f = 2 ** (len(self.unet.config.down_block_types) - 1)
            self.pixel_multiple = max(8, vae_f * unet_f)
        if args.resolution % self.pixel_multiple:
            raise UsageError(f"--resolution must be a multiple of {self.pixel_multiple} for this model")

    def _apply_recipe(self) -> None:
        """Fill the memory flags the user left unset from the GPU's recipe (CPU: no savings). A
        batch larger than the recipe's micro-batch becomes gradient accumulation: the same
        samples per optimizer step (batch_indices), so a resume on another GPU sees the same data."""
        args = self.args
        self.recipe = None
        resumed = getattr(args, "resume_state", None) or {}
        if args.optimizer is None and resumed.get("optimizer"):
            # The optimizer state in the checkpoint decides: a resume on a GPU with another recipe
            # continues with the optimizer it was saved with.
            args.optimizer = resumed["optimizer"]
        if self.device.type == "cuda" and args.memory_recipe == "auto":
            from .. import recipes

            usable = recipes.usable_vram_gb(self.torch, self.device)
            mode = "dreambooth" if args.mode == "dreambooth" else "lora"
            self.recipe = recipes.choose(self.family, mode, args.resolution, usable)
            log(f"memory recipe for {usable:.1f} GB usable: {self.recipe.describe()}")
            if args.gradient_checkpointing is None:
                args.gradient_checkpointing = self.recipe.gradient_checkpointing
            if args.optimizer is None:
                args.optimizer = self.recipe.optimizer
            if args.grad_accum is None and args.batch_size > self.recipe.max_batch:
                per_step = args.batch_size
                args.batch_size = max(d for d in range(1, self.recipe.max_batch + 1) if per_step % d == 0)
                args.grad_accum = per_step // args.batch_size
        if args.gradient_checkpointing is None:
            args.gradient_checkpointing = False
        if args.optimizer is None:
            args.optimizer = "adamw"
        if args.grad_accum is None:
            args.grad_accum = 1

    def frozen(self) -> list[Any]:
        return [m for m in (self.vae, self.text_encoder, self.text_encoder_2, self.text_encoder_3) if m is not None]

    def _encode_prompts(self, captions: list[str]) -> tuple[Any, Any | None]:
        """(prompt embeddings, pooled embeddings or None). SDXL: the penultimate hidden states of
        both encoders side by side, and the second encoder's projected pooled output."""
        dev = self.device
        if self.family == "sd3":
            return self._sd3_encode_prompts(captions)

        def ids(tok: Any) -> Any:
            return tok(captions, padding="max_length", truncation=True,
                       max_length=tok.model_max_length, return_tensors="pt").input_ids.to(dev)

        if self.text_encoder_2 is None:
            return self.text_encoder(ids(self.tokenizer))[0], None
        h1 = self.text_encoder(ids(self.tokenizer), output_hidden_states=True).hidden_states[-2]
        out2 = self.text_encoder_2(ids(self.tokenizer_2), output_hidden_states=True)
        return self.torch.cat([h1, out2.hidden_states[-2]], dim=-1), out2.text_embeds

    def _encode_dataset(self) -> None:
        """The VAE and text encoders are frozen: encode every image and caption once, keep the
        latent distribution (mean, std) and sample from it each step with a per-step generator."""
        import numpy as np

        torch, args = self.torch, self.args
        use_buckets = args.buckets if args.buckets is not None else self.family == "sdxl"
        buckets = make_buckets(args.resolution, self.pixel_multiple) if use_buckets else None
        if args.data_dir is not None:
            items = folder_images(args.data_dir, args.resolution, args.instance_prompt, buckets)
        else:
            items = synthetic_images(args.synthetic, args.resolution)
        self.n_images = len(items)
        self.lat_mean, self.lat_std, self.text_embeds, self.pooled, self.time_ids = [], [], [], [], []
        with torch.no_grad():
            for it in items:
                pix = torch.from_numpy(np.ascontiguousarray(it["pixels"])).permute(2, 0, 1)[None]
                pix = (pix.float() / 127.5 - 1.0).to(self.device)
                dist = self.vae.encode(pix).latent_dist
                self.lat_mean.append(dist.mean.float().cpu())
                self.lat_std.append(dist.std.float().cpu())
                emb, pooled = self._encode_prompts([it["caption"]])
                self.text_embeds.append(emb.float().cpu())
                h, w = it["pixels"].shape[:2]
                # SDXL's micro-conditioning: original size, crop top-left, target size.
                self.time_ids.append(torch.tensor([[*it["orig"], *it["crop"], h, w]],
                                                  dtype=torch.float32))
                self.pooled.append(pooled.float().cpu() if pooled is not None else None)
        self.buckets_used = {tuple(m.shape[-2:]) for m in self.lat_mean}
        self.scaling = float(getattr(self.vae.config, "scaling_factor", 0.18215))
        if self.device.type == "cuda" and not args.validation_prompt:
            # Cached: the encoders are not needed on the GPU again (validation moves them back).
            for m in self.frozen():
                m.to("cpu")

    def _setup_training(self) -> None:
        torch, args = self.torch, self.args
        # Seeds the LoRA init (and anything else drawing on the global generators).
        random.seed(args.seed)
        torch.manual_seed(args.seed)
        import numpy as np

        np.random.seed(args.seed % (1 << 32))
        if args.mode == "lora":
            from peft import LoraConfig

            self.unet.requires_grad_(False)
            self.unet.add_adapter(LoraConfig(r=args.rank, lora_alpha=args.rank,
                                             init_lora_weights="gaussian",
                                             target_modules=LORA_TARGETS_SD3 if self.family == "sd3" else LORA_TARGETS))
        else:
            self.unet.requires_grad_(True)
        if args.gradient_checkpointing:
            self.unet.enable_gradient_checkpointing()
        self.unet.train()
        # Trainable weights stay fp32 (autocast does the low-precision math).
        self.params = [p for p in self.unet.parameters() if p.requires_grad]
        for p in self.params:
            p.data = p.data.float()
        self.optimizer = make_optimizer(args, self.params, self.device)
        from diffusers.optimization import get_scheduler

        self.lr_scheduler = get_scheduler(args.lr_scheduler, self.optimizer,
                                          num_warmup_steps=args.lr_warmup_steps,
                                          num_training_steps=args.steps)
        self.scaler = torch.amp.GradScaler("cuda") if self.mixed_precision == "fp16" else None
        self.global_step = 0

    def _autocast(self) -> Any:
        import contextlib

        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return self.torch.autocast(self.device.type, dtype=self.autocast_dtype)
