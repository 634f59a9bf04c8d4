"""Base models for the builtin trainer: where they come from, which family they are, how to load them.

A model is named by one of:

- ``tiny`` / ``tiny-sd15`` / ``tiny-sd2`` / ``tiny-sdxl`` / ``tiny-sd3``: a random tiny pipeline (tests, demos);
  plain ``tiny`` takes the family asked for (``--family``), SD1.5 by default;
- a local diffusers folder (``model_index.json`` + ``unet/`` ..., or ``transformer/`` for SD3);
- a single-file checkpoint (``.safetensors``, the original LDM/SGM layout community models use);
- a Hugging Face hub id (``stabilityai/stable-diffusion-xl-base-1.0``), downloaded on the host.

Family detection here is pure Python (JSON headers and configs; no torch), so the control plane can
use it before launch. The families: ``sd15`` (SD 1.x), ``sd2`` (SD 2.x, often v-prediction),
``sdxl``, ``sd3`` (SD3 and SD3.5: a folder whose ``transformer/config.json`` names
``SD3Transformer2DModel`` or whose ``model_index.json`` names ``StableDiffusion3Pipeline``; a single
file with MMDiT ``joint_blocks``).
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

# The families and the pipeline live below both this module and tiny.py (which this one loads).
from .families import FAMILIES, pipeline  # noqa: F401 - models.FAMILIES and models.pipeline are its API

TINY_NAMES = {"tiny": None, "tiny-sd15": "sd15", "tiny-sd2": "sd2", "tiny-sdxl": "sdxl", "tiny-sd3": "sd3"}

# Hub ids whose family is known without looking (the ones users name most). Other ids are
# recognised by their published names or the local Hugging Face cache, else checked on the host.
KNOWN_HUB_IDS = {
    "stable-diffusion-v1-5/stable-diffusion-v1-5": "sd15",
    "runwayml/stable-diffusion-v1-5": "sd15",
    "compvis/stable-diffusion-v1-4": "sd15",
    "stabilityai/stable-diffusion-2-1": "sd2",
    "stabilityai/stable-diffusion-2-1-base": "sd2",
    "stabilityai/stable-diffusion-2": "sd2",
    "stabilityai/stable-diffusion-2-base": "sd2",
    "stabilityai/stable-diffusion-xl-base-1.0": "sdxl",
    "stabilityai/sdxl-turbo": "sdxl",
    # Gated: a download needs a Hugging Face token whose account accepted the licence.
    "stabilityai/stable-diffusion-3-medium-diffusers": "sd3",
    "stabilityai/stable-diffusion-3.5-medium": "sd3",
    "stabilityai/stable-diffusion-3.5-large": "sd3",
    "stabilityai/stable-diffusion-3.5-large-turbo": "sd3",
}

SD3_TRANSFORMER = "SD3Transformer2DModel"
SD3_PIPELINE = "StableDiffusion3Pipeline"


class ModelError(ValueError):
    """The model cannot be used (missing, unreadable, wrong family): a usage error."""


def is_tiny(model: str) -> bool:
    return model in TINY_NAMES


def is_single_file(model: str) -> bool:
    return model.lower().endswith((".safetensors", ".ckpt"))


def looks_like_hub_id(model: str) -> bool:
    """`owner/name` that is not a path on this machine nor a URL."""
    if "://" in model or model.startswith((".", "/", "~")) or is_single_file(model):
        return False
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not Path(model).exists()


def family_from_unet_config(cfg: dict) -> str:
    """SDXL's UNet takes pooled text + time ids; SD2 (unlike SD1) uses linear attention projections."""
    if cfg.get("addition_embed_type") == "text_time":
        return "sdxl"
    return "sd2" if cfg.get("use_linear_projection") else "sd15"


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def folder_family(path: Path) -> str | None:
    """sd3 by its transformer's (or pipeline's) class; the others by the UNet's config. A
    transformer of another model (Flux, PixArt ...) is refused by name."""
    transformer = _json(path / "transformer" / "config.json")
    pipe = _json(path / "model_index.json").get("_class_name")
    if transformer.get("_class_name") == SD3_TRANSFORMER or pipe == SD3_PIPELINE:
        return "sd3"
    if transformer:
        raise ModelError(f"{path}: a {transformer.get('_class_name') or 'transformer'} model "
                         f"({pipe or 'no model_index.json'}), not a family sdcloud trains")
    cfg = path / "unet" / "config.json"
    if not cfg.is_file():
        return None
    try:
        return family_from_unet_config(json.loads(cfg.read_text()))
    except (OSError, ValueError):
        return None


def safetensors_keys(path: Path) -> list[str]:
    """Tensor names from a .safetensors header (8-byte length, then JSON), without reading weights."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100 * 1024 * 1024:
                raise ModelError(f"{path}: not a safetensors file (header of {n} bytes)")
            header = json.loads(f.read(n))
    except (OSError, struct.error, ValueError) as exc:
        raise ModelError(f"{path}: not a readable safetensors file ({exc})") from None
    return [k for k in header if k != "__metadata__"]


def file_family(path: Path) -> str | None:
    """The family of a single-file checkpoint from its tensor names: SDXL (SGM) keeps two text
    encoders under conditioner.embedders.{0,1}; SD2 an OpenCLIP encoder under cond_stage_model.model;
    SD1 a CLIP transformer under cond_stage_model.transformer."""
    if path.suffix.lower() != ".safetensors":
        return None  # a pickled .ckpt is not opened before it is loaded on the host
    keys = safetensors_keys(path)
    if any(k.startswith(("model.diffusion_model.joint_blocks.", "joint_blocks.")) for k in keys):
        return "sd3"  # SD3's MMDiT (with or without text_encoders.clip_l/clip_g/t5xxl beside it)
    if any(k.startswith("conditioner.embedders.1.") for k in keys):
        return "sdxl"
    if any(k.startswith("cond_stage_model.model.") for k in keys):
        return "sd2"
    if any(k.startswith("cond_stage_model.transformer.") for k in keys):
        return "sd15"
    if any(k.startswith("model.diffusion_model.") for k in keys):
        # A UNet without its text encoder: SDXL's has label_emb (the pooled/time conditioning).
        return "sdxl" if any(k.startswith("model.diffusion_model.label_emb.") for k in keys) else None
    raise ModelError(f"{path}: no Stable Diffusion UNet in this file (a LoRA or a VAE?)")


def hub_family(model_id: str) -> str | None:
    """Known ids, then the local Hugging Face cache (never the network), then the published name."""
    known = KNOWN_HUB_IDS.get(model_id.lower())
    if known:
        return known
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model_id, "transformer/config.json")
        if isinstance(cached, str):
            return "sd3" if _json(Path(cached)).get("_class_name") == SD3_TRANSFORMER else None
        cached = try_to_load_from_cache(model_id, "unet/config.json")
        if isinstance(cached, str):
            return family_from_unet_config(json.loads(Path(cached).read_text()))
    except Exception:  # noqa: BLE001 - no hub library or an odd cache: fall back to the name
        pass
    name = model_id.lower().split("/")[-1]
    if "stable-diffusion-3" in name or "sd3" in name or "sd-3" in name:
        return "sd3"
    if "xl" in name.replace("-", "").replace("_", ""):
        return "sdxl"
    if "stable-diffusion-2" in name or "sd2" in name or "sd-2" in name:
        return "sd2"
    if "stable-diffusion-v1" in name or "sd15" in name or "sd-1.5" in name or "v1-5" in name:
        return "sd15"
    return None


def detect_family(model: str, default_tiny: str | None = None) -> str | None:
    """The model's family, or None when it cannot be told without loading (a bucket URL, an
    unknown hub id): the host's loader checks those."""
    if is_tiny(model):
        return TINY_NAMES[model] or default_tiny or "sd15"
    if "://" in model:
        return None
    path = Path(model).expanduser()
    if path.is_dir():
        if not any(path.iterdir()):
            raise ModelError(f"{model}: an empty folder, not a model")
        fam = folder_family(path)
        if fam is None:
            raise ModelError(f"{model}: a folder without unet/config.json (nor an SD3 transformer/config.json) "
                             "is not a diffusers model")
        return fam
    if is_single_file(model):
        if not path.is_file():
            raise ModelError(f"{model}: no such file")
        return file_family(path)
    if model.startswith((".", "/", "~")) and not path.exists():
        raise ModelError(f"{model}: no such file or folder")
    if looks_like_hub_id(model):
        return hub_family(model)
    raise ModelError(f"{model}: not 'tiny', a diffusers folder, a .safetensors file, a bucket URL "
                     "nor a hub id (owner/name)")


# ---------------------------------------------------------------------------------------------
# Loading (on the host; imports torch and diffusers)

# ---------------------------------------------------------------------------------------------
# Which files of a hub repository training needs: one rule for every hub id (the trainers' loader
# here and the host's model cache, sdcloud_agent/models.py).

_WEIGHTS = re.compile(r"^(diffusion_pytorch_model|model)(-\d{5}-of-\d{5})?(?:\.([A-Za-z0-9_]+))?\.safetensors$")
_VARIANT_INDEX = re.compile(r"^(diffusion_pytorch_model|model)\.safetensors\.index\.([A-Za-z0-9_]+)\.json$")


def hub_selection(files: list[str], components: list[str] | None) -> tuple[list[str], dict[str, str]]:
    """(the files to fetch, {fetched name: name to keep it under}) for a diffusers repository.

    The pipeline's components (the folders `model_index.json` names; the top level for a repo of
    one component), each with its configs and tokenizer files (`*.json`, `*.txt`, T5's
    SentencePiece `spiece.model`) and its weights
    in safetensors, one precision variant: the plain files (what kohya and `from_pretrained`
    without a variant load), else fp16, else the first variant, kept under the plain name. Never:
    flax (`*.msgpack`), onnx, openvino, PyTorch `.bin` duplicates, folders the pipeline does not
    name (SDXL base's `vae_1_0/`, `vae_decoder/`; SD3.5's `text_encoders/` with its second T5 in
    fp8), nor top-level single-file copies (`sd3.5_large.safetensors`)."""
    have = set(files)
    dirs = [f"{c}/" for c in components] if components is not None else [""]
    wanted: list[str] = ["model_index.json"] if "model_index.json" in have else []
    renames: dict[str, str] = {}
    for d in dirs:
        names = [f[len(d):] for f in files if f.startswith(d) and "/" not in f[len(d):]]
        weights: dict[str | None, list[str]] = {}
        for n in names:
            m = _WEIGHTS.match(n)
            if m:
                weights.setdefault(m.group(3), []).append(n)
            elif n.endswith((".json", ".txt", ".model")) and not _VARIANT_INDEX.match(n) and (d or n != "model_index.json"):
                wanted.append(d + n)
        if not weights:
            continue
        variant = None if None in weights else ("fp16" if "fp16" in weights else sorted(weights)[0])
        for n in sorted(weights[variant]):
            wanted.append(d + n)
            if variant is not None:
                renames[d + n] = d + n.replace(f".{variant}.safetensors", ".safetensors")
        if variant is not None:
            for n in names:
                m = _VARIANT_INDEX.match(n)
                if m and m.group(2) == variant:
                    wanted.append(d + n)
                    renames[d + n] = d + f"{m.group(1)}.safetensors.index.json"
    return wanted, renames


# kohya's SD3 scripts read the single-file checkpoint and the encoders' own files, not the diffusers
# folders (its docs/sd3_train_network.md: --pretrained_model_name_or_path a .safetensors, --clip_l,
# --clip_g, --t5xxl); the SD3.5 repositories carry both layouts.
SD3_ENCODER_FILES = {"clip_l": ("clip_l.safetensors",), "clip_g": ("clip_g.safetensors",),
                     "t5xxl": ("t5xxl_fp16.safetensors", "t5xxl_fp8_e4m3fn.safetensors")}


def single_file_selection(files: list[str]) -> list[str]:
    """The files kohya's SD3 scripts need from an SD3 repository: its top-level single-file
    checkpoint and, under text_encoders/, CLIP-L, CLIP-G and one T5-XXL (fp16, else fp8): one
    precision each, none of the diffusers folders."""
    have = set(files)
    tops = sorted(f for f in files if "/" not in f and f.endswith(".safetensors"))
    if not tops:
        raise ModelError("the repository has no top-level single-file .safetensors checkpoint for kohya's SD3 "
                         "scripts: give one with --model FILE.safetensors")
    wanted = [tops[0]]
    for names in SD3_ENCODER_FILES.values():
        found = next((f"text_encoders/{n}" for n in names if f"text_encoders/{n}" in have), None)
        if found:
            wanted.append(found)
    return wanted


def sd3_single_file_flags(folder: Path) -> dict[str, str]:
    """kohya's model flags for a folder that single_file_selection filled (or a user's of that layout)."""
    tops = sorted(p for p in folder.glob("*.safetensors") if p.is_file())
    if not tops:
        return {}
    out = {"pretrained_model_name_or_path": str(tops[0])}
    for flag, names in SD3_ENCODER_FILES.items():
        found = next((folder / "text_encoders" / n for n in names if (folder / "text_encoders" / n).is_file()), None)
        if found:
            out[flag] = str(found)
    return out


def download_hub(model: str, local_dir: Path | None = None, token: str | None = None,
                 single_file: bool = False) -> Path:
    """Fetch what training needs of hub repo `org/name[@revision]` (hub_selection) from the hub
    endpoint (HF_ENDPOINT, a mirror); into `local_dir` (variants renamed to the plain names) or the
    Hugging Face cache. `token`: the user's, for a gated repository (else huggingface_hub's own
    lookup). Returns the folder."""
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download

    repo, _, rev = model.partition("@")
    info = HfApi(token=token).model_info(repo, revision=rev or None)
    files = [s.rfilename for s in (info.siblings or [])]
    if single_file:
        return Path(snapshot_download(repo, revision=info.sha, local_dir=str(local_dir) if local_dir else None,
                                      allow_patterns=single_file_selection(files), token=token))
    components = None
    if "model_index.json" in files:
        index = json.loads(Path(hf_hub_download(repo, "model_index.json", revision=info.sha, token=token,
                                                local_dir=str(local_dir) if local_dir else None)).read_text())
        components = [k for k, v in index.items() if not k.startswith("_") and isinstance(v, list) and v and v[0]]
    wanted, renames = hub_selection(files, components)
    if not any(_WEIGHTS.match(f.rsplit("/", 1)[-1]) for f in wanted):
        raise ModelError(f"--model {model}: the repository has no safetensors weights for its components "
                         "(flax, onnx or .bin only?): convert it, or give a .safetensors file")
    folder = Path(snapshot_download(repo, revision=info.sha, local_dir=str(local_dir) if local_dir else None,
                                    allow_patterns=wanted, token=token))
    if local_dir is not None:
        for src, dst in renames.items():
            (folder / src).replace(folder / dst)
    return folder


def _sd3_components(pipe: Any) -> dict[str, Any]:
    from .families import SD3_KEYS

    return {k: v for k, v in pipe.components.items() if k in SD3_KEYS and v is not None}


def _sd3_from_folder(path: Path) -> dict[str, Any]:
    """transformer, vae, the three text encoders and tokenizers, the flow-matching scheduler. A
    folder without text_encoder_3 (T5 dropped to save memory) loads without it."""
    from diffusers import StableDiffusion3Pipeline

    kw: dict[str, Any] = {"local_files_only": True}
    if not (path / "text_encoder_3").is_dir():
        kw.update(text_encoder_3=None, tokenizer_3=None)
    return _sd3_components(StableDiffusion3Pipeline.from_pretrained(path, **kw))


def _from_folder(path: Path) -> dict[str, Any]:
    if folder_family(path) == "sd3":
        return _sd3_from_folder(path)
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    kw = {"local_files_only": True}
    c: dict[str, Any] = {
        "unet": UNet2DConditionModel.from_pretrained(path, subfolder="unet", **kw),
        "vae": AutoencoderKL.from_pretrained(path, subfolder="vae", **kw),
        "text_encoder": CLIPTextModel.from_pretrained(path, subfolder="text_encoder", **kw),
        "tokenizer": CLIPTokenizer.from_pretrained(path, subfolder="tokenizer", **kw),
        # Training samples noise the DDPM way whatever sampler the pipeline ships with.
        "scheduler": DDPMScheduler.from_pretrained(path, subfolder="scheduler", **kw)}
    if (path / "text_encoder_2").is_dir():
        c["text_encoder_2"] = CLIPTextModelWithProjection.from_pretrained(
            path, subfolder="text_encoder_2", **kw)
        c["tokenizer_2"] = CLIPTokenizer.from_pretrained(path, subfolder="tokenizer_2", **kw)
    return c


def _from_single_file(path: Path, family: str | None, config: str | None) -> dict[str, Any]:
    from diffusers import DDPMScheduler, StableDiffusionPipeline, StableDiffusionXLPipeline

    family = family or file_family(path)
    if family == "sd3":
        from diffusers import StableDiffusion3Pipeline

        kw3: dict[str, Any] = {"config": config} if config else {}
        return _sd3_components(StableDiffusion3Pipeline.from_single_file(str(path), **kw3))
    cls = StableDiffusionXLPipeline if family == "sdxl" else StableDiffusionPipeline
    kw: dict[str, Any] = {"config": config} if config else {}
    if cls is StableDiffusionPipeline:
        kw.update(safety_checker=None, requires_safety_checker=False)
    pipe = cls.from_single_file(str(path), **kw)
    c = {k: v for k, v in pipe.components.items()
         if k in ("unet", "vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")}
    c["scheduler"] = DDPMScheduler.from_config(pipe.scheduler.config)
    return c


def load_components(model: str, family: str | None = None, resolution: int = 32,
                    config: str | None = None) -> dict[str, Any]:
    """unet, vae, text_encoder, tokenizer, scheduler (+ text_encoder_2, tokenizer_2 for SDXL); for SD3
    transformer in place of unet, + text_encoder_3/tokenizer_3 (T5) and a flow-matching scheduler."""
    if is_tiny(model):
        from . import tiny

        return tiny.build_components(resolution=resolution, family=TINY_NAMES[model] or family or "sd15")
    path = Path(model).expanduser()
    if path.is_dir():
        if folder_family(path) is None:
            raise ModelError(f"--model {model}: a folder without unet/config.json")
        return _from_folder(path)
    if is_single_file(model):
        if not path.is_file():
            raise ModelError(f"--model {model}: no such file")
        return _from_single_file(path, family, config)
    if looks_like_hub_id(model):
        # Only the files training needs, in safetensors, one precision (hub_selection).
        return _from_folder(download_hub(model))
    raise ModelError(f"--model {model}: not tiny, a diffusers folder, a .safetensors file nor a hub id")


def family_of(components: dict[str, Any]) -> str:
    from .families import family_of_components

    return family_of_components(components) or family_from_unet_config(dict(components["unet"].config))
