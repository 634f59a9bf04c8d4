"""What the builtin trainer does differently for the sd3 family (SD3, SD3.5 Medium / Large / Turbo).

The transformer takes the UNet's place (the trainer keeps it under ``self.unet``, so checkpoints,
resume, DDP and the LoRA/DreamBooth split stay one code path); the captions are encoded once by
the pipeline's own ``encode_prompt`` (CLIP-L and CLIP-G penultimate states side by side, padded to
T5's width and followed by T5's states; the two CLIP projections pooled), after which the three
encoders leave the GPU. A model without T5 (``text_encoder_3`` absent) trains on zeros in its
place, as the pipeline does.

The objective is the SD3 paper's rectified flow (Esser et al. 2024, "Scaling Rectified Flow
Transformers", arXiv 2403.03206): the noisy latent is ``(1 - sigma) * x + sigma * noise``, the
target the velocity ``noise - x``, the loss its plain mean squared error, with sigma drawn from
the logit-normal density (mean 0, std 1: the paper's choice) through the scheduler's shifted sigma
table (shift 3.0 for SD3). That is neither trainer's default exactly: the diffusers SD3 examples
(train_dreambooth_lora_sd3.py) draw the same density but precondition the output by default
(``--precondition_outputs 1``: the error is taken on ``x``, which weights the velocity error by
sigma squared), and kohya's sd3_train_network.py draws sigma uniformly with its own shift.
``--weighting-scheme`` offers the diffusers scripts' choices (their training_utils functions,
``compute_density_for_timestep_sampling`` and ``compute_loss_weighting_for_sd3``, restated here
so the trainer needs no newer diffusers) and ``none``, the uniform draw with unit weights;
``--precondition-outputs`` takes the diffusers examples' target. The draws come from the step's
generator, so a resumed run draws what the uninterrupted one would have.
"""

from __future__ import annotations

import math
from typing import Any

# The transformer's attention projections, the image stream's and the text stream's (add_*): the
# modules the diffusers SD3 LoRA example targets by default.
LORA_TARGETS_SD3 = ["to_k", "to_q", "to_v", "to_out.0", "add_k_proj", "add_q_proj", "add_v_proj", "to_add_out"]
MAX_SEQUENCE_LENGTH = 77  # T5 tokens per caption: the diffusers SD3 examples' default
# The diffusers SD3 scripts' --weighting_scheme choices and "none" (uniform draw, unit weights);
# logit_normal first: the default, the SD3 paper's. Their fixed parameters are the scripts'
# defaults (--logit_mean 0, --logit_std 1, --mode_scale 1.29).
WEIGHTING_SCHEMES = ("logit_normal", "none", "sigma_sqrt", "mode", "cosmap")
MODE_SCALE = 1.29


def timestep_density(torch: Any, scheme: str, n: int, g: Any, device: Any) -> Any:
    """n draws in [0, 1) of where on the sigma table a sample lands: diffusers'
    compute_density_for_timestep_sampling, drawn from the step's generator."""
    if scheme == "logit_normal":
        return torch.sigmoid(torch.randn((n,), generator=g, device=device))
    u = torch.rand((n,), generator=g, device=device)
    if scheme == "mode":
        return 1 - u - MODE_SCALE * (torch.cos(math.pi * u / 2) ** 2 - 1 + u)
    return u


def loss_weighting(torch: Any, scheme: str, sigmas: Any) -> Any:
    """The per-sample weight of the squared error: diffusers' compute_loss_weighting_for_sd3."""
    if scheme == "sigma_sqrt":
        return (sigmas ** -2.0).float()
    if scheme == "cosmap":
        return 2 / (math.pi * (1 - 2 * sigmas + 2 * sigmas ** 2))
    return torch.ones_like(sigmas)


def flow_matching_terms(torch: Any, scheme: str, precondition: bool, pred: Any, noisy: Any, latents: Any,
                        noise: Any, sigmas: Any) -> tuple[Any, Any, Any]:
    """(prediction, target, weighting) of the loss ``mean(weighting * (prediction - target)^2)``.
    Preconditioned (diffusers' default), the velocity is turned into ``x``'s estimate and compared
    with ``x``: ``noisy - sigma * v - x = sigma * (noise - x - v)``, the velocity error times sigma."""
    if precondition:
        return pred * (-sigmas) + noisy, latents, loss_weighting(torch, scheme, sigmas)
    return pred, noise - latents, loss_weighting(torch, scheme, sigmas)


class SD3Setup:
    """Mixed into the trainer: loading, caption encoding, the loss and the output for sd3."""

    def _sd3_adopt(self, c: dict[str, Any]) -> None:
        self.unet = c["transformer"]
        self.vae, self.text_encoder, self.tokenizer = c["vae"], c["text_encoder"], c["tokenizer"]
        self.text_encoder_2, self.tokenizer_2 = c.get("text_encoder_2"), c.get("tokenizer_2")
        self.text_encoder_3, self.tokenizer_3 = c.get("text_encoder_3"), c.get("tokenizer_3")
        self.noise_scheduler = c["scheduler"]
        # The training table of timesteps and sigmas, copied: a validation pipeline's set_timesteps
        # changes the scheduler's own.
        self.sd3_timesteps = self.noise_scheduler.timesteps.clone().float()
        self.sd3_sigmas = self.noise_scheduler.sigmas.clone().float()
        self.latent_shift = float(getattr(self.vae.config, "shift_factor", None) or 0.0)

    def _sd3_pixel_multiple(self) -> int:
        vae_f = 2 ** (len(self.vae.config.block_out_channels) - 1)
        return max(8, vae_f * int(self.unet.config.patch_size))

    def _sd3_encode_prompts(self, captions: list[str]) -> tuple[Any, Any]:
        from diffusers import StableDiffusion3Pipeline

        # The transformer is there for its config only (without T5: the width of the zeros).
        pipe = StableDiffusion3Pipeline(
            transformer=self.unet, scheduler=self.noise_scheduler, vae=self.vae,
            text_encoder=self.text_encoder, tokenizer=self.tokenizer,
            text_encoder_2=self.text_encoder_2, tokenizer_2=self.tokenizer_2,
            text_encoder_3=self.text_encoder_3, tokenizer_3=self.tokenizer_3)
        embeds, _, pooled, _ = pipe.encode_prompt(
            captions, prompt_2=None, prompt_3=None, device=self.device, num_images_per_prompt=1,
            do_classifier_free_guidance=False, max_sequence_length=MAX_SEQUENCE_LENGTH)
        return embeds, pooled

    def _sd3_backward(self, mean: Any, std: Any, members: list[int], g: Any, per_step: int) -> float:
        """One group's forward and backward pass (its share of the step's loss); the loss value."""
        torch, dev = self.torch, self.device
        latents = (mean + std * torch.randn(mean.shape, generator=g, device=dev) - self.latent_shift) * self.scaling
        noise = torch.randn(latents.shape, generator=g, device=dev)
        u = timestep_density(torch, self.args.weighting_scheme, latents.shape[0], g, dev)
        idx = (u * len(self.sd3_timesteps)).long().clamp(max=len(self.sd3_timesteps) - 1).cpu()
        timesteps = self.sd3_timesteps[idx].to(dev)
        sigmas = self.sd3_sigmas[idx].to(dev).view(-1, 1, 1, 1)
        noisy = (1.0 - sigmas) * latents + sigmas * noise
        enc = torch.cat([self.text_embeds[i] for i in members]).to(dev)
        pooled = torch.cat([self.pooled[i] for i in members]).to(dev)
        with self._autocast():
            pred = self.unet(hidden_states=noisy, timestep=timesteps, encoder_hidden_states=enc,
                             pooled_projections=pooled, return_dict=False)[0]
        pred, target, weighting = flow_matching_terms(torch, self.args.weighting_scheme, self.args.precondition_outputs,
                                                      pred.float(), noisy, latents, noise, sigmas)
        return self._backward_share(pred, target, len(members) / per_step, weighting)

    def _sd3_lora_file(self, peft_sd: dict[str, Any]) -> dict[str, Any]:
        """The layout StableDiffusion3Pipeline.save_lora_weights writes (as the diffusers SD3 LoRA
        example saves it) and load_lora_weights reads: PEFT's lora_A/lora_B keys under
        "transformer.". ComfyUI reads the same file for SD3 (comfy/lora.py maps these
        "transformer.<module>" keys onto its MMDiT), so it is the one file for both."""
        return {f"transformer.{k}": v for k, v in peft_sd.items()}


def readme_lines(args: Any, base: str, lora_file: str) -> list[str]:
    """The README's loader examples for an SD3 LoRA."""
    return [f"- `{lora_file}`: the LoRA on the SD3 transformer (rank {args.rank}), diffusers format; "
            "ComfyUI loads the same file.", "",
            "## diffusers", "", "```python", "import torch",
            "from diffusers import StableDiffusion3Pipeline",
            f"pipe = StableDiffusion3Pipeline.from_pretrained({base!r}, torch_dtype=torch.bfloat16).to('cuda')",
            "pipe.load_lora_weights('.')  # this folder",
            "image = pipe('a photo of sks', num_inference_steps=40, guidance_scale=4.5).images[0]", "```", "",
            "## ComfyUI", "",
            f"Copy `{lora_file}` to `ComfyUI/models/loras/`, then add a *LoraLoaderModelOnly* node after "
            "the SD3.5 checkpoint loader (the same base model)."]
