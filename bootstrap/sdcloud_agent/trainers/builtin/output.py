"""The finished model: LoRA weights in the diffusers and kohya layouts (or the full UNet), a README,
and validation images.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any


DIFFUSERS_LORA = "pytorch_lora_weights.safetensors"


KOHYA_LORA = "lora_kohya.safetensors"


PIPELINES = {"sd15": "StableDiffusionPipeline", "sd2": "StableDiffusionPipeline",
             "sdxl": "StableDiffusionXLPipeline", "sd3": "StableDiffusion3Pipeline"}


def _atomic_save(save_file: Any, tensors: dict[str, Any], path: Path, meta: dict[str, str]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, path)


def readme(args: argparse.Namespace, family: str, step: int, files: list[str]) -> str:
    """The artifacts' README: what the files are and how to load them."""
    pipe = PIPELINES[family]
    base = args.model
    lines = [f"# sdcloud {args.mode} ({family})", "",
             f"Base model: `{base}` ({family}); {step} steps at {args.resolution} px, seed {args.seed}.",
             "", "## Files", ""]
    if args.mode == "lora" and family == "sd3":
        from .sd3 import readme_lines

        lines += readme_lines(args, base, DIFFUSERS_LORA)
    elif args.mode == "lora":
        lines += [f"- `{DIFFUSERS_LORA}`: the LoRA in diffusers format (rank {args.rank}).",
                  f"- `{KOHYA_LORA}`: the same LoRA in kohya format (`lora_unet_...` keys with alpha), "
                  "for AUTOMATIC1111, ComfyUI and kohya sd-scripts.", "",
                  "## diffusers", "", "```python", "import torch",
                  f"from diffusers import {pipe}",
                  f"pipe = {pipe}.from_pretrained({base!r}, torch_dtype=torch.float16).to('cuda')",
                  "pipe.load_lora_weights('.')  # this folder",
                  f"# or the kohya file: pipe.load_lora_weights('.', weight_name='{KOHYA_LORA}')",
                  "image = pipe('a photo of sks').images[0]", "```", "",
                  "## ComfyUI", "",
                  f"Copy `{KOHYA_LORA}` to `ComfyUI/models/loras/`, then add a *Load LoRA* node "
                  "between the checkpoint loader (the same base model) and the sampler.", "",
                  "## AUTOMATIC1111", "",
                  f"Copy `{KOHYA_LORA}` to `stable-diffusion-webui/models/Lora/`, select the same base "
                  "checkpoint, and add `<lora:lora_kohya:1>` to the prompt."]
    else:
        lines += ["- a diffusers pipeline folder: " + ", ".join(f"`{f}`" for f in files), "",
                  "## diffusers", "", "```python", f"from diffusers import {pipe}",
                  f"pipe = {pipe}.from_pretrained('.')  # this folder", "```", "",
                  "## ComfyUI and AUTOMATIC1111", "",
                  "Both load single-file checkpoints: convert this folder with diffusers' "
                  "`scripts/convert_diffusers_to_original_stable_diffusion.py` (SDXL: "
                  "`convert_diffusers_to_original_sdxl.py`), then copy the file to "
                  "`ComfyUI/models/checkpoints/` or `stable-diffusion-webui/models/Stable-diffusion/`."]
    return "\n".join(lines) + "\n"


class Output:
    def _samples_due(self) -> bool:
        every, step = self.args.sample_every, self.global_step
        return bool(self.args.validation_prompt) and (not every or step % every == 0 or step >= self.args.steps)

    def _validation_images(self, folder: Path) -> None:
        """sample-NN.png for each --validation-prompt, fixed seeds (prompt i: --sample-seed + i): the
        same prompt at every checkpoint, so a user sees the training progress; samples.json beside
        them says each one's prompt, seed, sampler and the seconds it took (the agent puts both in the
        run's store, sdcloud_agent/samples.py). The RNG is put back afterwards so that taking samples
        never changes what training does next."""
        args, torch = self.args, self.torch
        if not self._samples_due():
            return
        import json
        import time

        from diffusers import EulerDiscreteScheduler, FlowMatchEulerDiscreteScheduler

        from ..models import pipeline

        cpu_rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        for m in self.frozen():
            m.to(self.device)
        self.unet.eval()
        base_seed = args.seed if args.sample_seed is None else args.sample_seed
        record = []
        try:
            sampler = FlowMatchEulerDiscreteScheduler if self.family == "sd3" else EulerDiscreteScheduler
            pipe = pipeline({**self.components, "scheduler": sampler.from_config(self.noise_scheduler.config)})
            pipe.set_progress_bar_config(disable=True)
            for i, prompt in enumerate(args.validation_prompt):
                t0 = time.perf_counter()
                gen = torch.Generator(device=self.device).manual_seed(base_seed + i)
                with torch.no_grad(), self._autocast():
                    image = pipe(prompt, num_inference_steps=args.validation_steps,
                                 height=args.resolution, width=args.resolution,
                                 generator=gen).images[0]
                image.save(folder / f"sample-{i:02d}.png")
                record.append({"index": i, "prompt": prompt, "seed": base_seed + i,
                               "sampler": "flow-match-euler" if self.family == "sd3" else "euler",
                               "steps": args.validation_steps, "gpu_s": round(time.perf_counter() - t0, 3)})
            (folder / "samples.json").write_text(json.dumps({"step": self.global_step, "images": record}, indent=1))
        finally:
            self.unet.train()
            torch.set_rng_state(cpu_rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)

    def write_output(self, out: Path | None = None) -> Path:
        """LoRA: the diffusers file, the kohya file (A1111, ComfyUI) and a README. DreamBooth: a
        diffusers pipeline folder and a README. `out`: another folder than --output (a checkpoint's
        export/, which `sdcloud pull --step N` fetches)."""
        from safetensors.torch import save_file

        out = out or self.args.output
        out.mkdir(parents=True, exist_ok=True)
        files: list[str] = []
        if self.args.mode == "lora" and self.family == "sd3":
            _atomic_save(save_file, self._sd3_lora_file(self._weights()), out / DIFFUSERS_LORA,
                         {"format": "pt", "global_step": str(self.global_step)})
            files = [DIFFUSERS_LORA]
        elif self.args.mode == "lora":
            from diffusers.utils import convert_state_dict_to_diffusers

            from ..lora_export import to_kohya

            peft_sd = self._weights()
            # The layout StableDiffusionPipeline.save_lora_weights writes and load_lora_weights
            # reads: "unet."-prefixed diffusers-style keys in one safetensors file.
            sd = convert_state_dict_to_diffusers(dict(peft_sd))
            meta = {"format": "pt", "global_step": str(self.global_step)}
            _atomic_save(save_file, {f"unet.{k}": v for k, v in sd.items()},
                         out / DIFFUSERS_LORA, meta)
            kohya = to_kohya(peft_sd, alpha=self.args.rank, sdxl=self.family == "sdxl",
                             layers_per_block=int(self.unet.config.layers_per_block))
            _atomic_save(save_file, kohya, out / KOHYA_LORA, {
                "ss_network_module": "networks.lora", "ss_network_dim": str(self.args.rank),
                "ss_network_alpha": str(self.args.rank), "ss_base_model_version": self.family,
                "ss_steps": str(self.global_step), "ss_resolution": str(self.args.resolution),
                "sdcloud_base_model": self.args.model})
            files = [DIFFUSERS_LORA, KOHYA_LORA]
        else:
            from ..models import pipeline

            pipeline(self.components).save_pretrained(str(out), safe_serialization=True)
            files = ["model_index.json", "transformer/" if self.family == "sd3" else "unet/", "vae/",
                     "text_encoder/", "tokenizer/"]
        (out / "README.md").write_text(readme(self.args, self.family, self.global_step, files),
                                       encoding="utf-8")
        return out
