"""The prompts file: plain text (one prompt a line) or JSONL, checked line by line before anything launches."""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError

SCHEDULERS = ("ddim", "euler", "euler_a", "dpmpp_2m", "pndm", "lms", "flow_euler")
# SD3 / SD3.5 are flow-matching models: they sample with the flow-matching Euler scheduler only, and
# the others take none of it.
FLOW_SCHEDULERS = ("flow_euler",)
FIELDS = {"prompt", "negative_prompt", "seed", "count", "width", "height", "steps", "guidance", "scheduler"}
DEFAULTS = {"sd15": {"width": 512, "height": 512, "steps": 30, "guidance": 7.5, "scheduler": "dpmpp_2m"},
            "sdxl": {"width": 1024, "height": 1024, "steps": 30, "guidance": 5.0, "scheduler": "euler"},
            # SD3.5 Medium's model card: 40 steps at guidance 4.5 (Large: 28 at 3.5), 1024 px.
            "sd3": {"width": 1024, "height": 1024, "steps": 40, "guidance": 4.5, "scheduler": "flow_euler"}}
# Model `tiny` (sdcloud_agent/trainers/tiny.py: random weights, a 2-block UNet and a VAE that halves
# the image, built for tests on a CPU): its own small defaults. At SD's 512 px and 30 steps a CPU
# made 0 of 20 images in 21 minutes; at 64 px and 2 steps the same 20 took 28 s (issue 23).
TINY = "tiny"
TINY_DEFAULTS = {"width": 64, "height": 64, "steps": 2}
# What each model takes: (lowest side, highest side, side multiple, most steps). SD 1.5 and SDXL
# decode latents 8 times smaller than the image; tiny's sides stay small (a test model, on a CPU).
LIMITS = {"sd": (64, 2048, 8, 200), "tiny": (32, 512, 8, 50)}
SETTING_FLAGS = ("width", "height", "steps")
# Images per work item: small enough that a reclaim loses little, big enough to fill a GPU batch.
IMAGES_PER_ITEM = 4


def defaults_for(family: str, model: str | None) -> dict[str, Any]:
    """The settings a prompt gets when neither its line nor a flag gives them."""
    out = dict(DEFAULTS[family])
    if model == TINY:
        out.update(TINY_DEFAULTS)
    return out


def limits_for(model: str | None) -> tuple[int, int, int, int]:
    return LIMITS["tiny" if model == TINY else "sd"]


def check_settings(settings: dict[str, Any], model: str | None) -> dict[str, int]:
    """`--width/--height/--steps` against the model; the ones given, as integers."""
    lo, hi, mult, most = limits_for(model)
    what = "the tiny model" if model == TINY else "Stable Diffusion"
    out = {}
    for key in SETTING_FLAGS:
        value = settings.get(key)
        if value is None:
            continue
        if key == "steps":
            out[key] = _int(value, "steps", f"--steps for {what}", 1, most)
        else:
            out[key] = _int(value, key, f"--{key} for {what}", lo, hi, mult)
    return out


def describe(prompts: list["Prompt"], family: str, model: str | None, given: dict[str, Any]) -> str:
    """The settings the job renders with, in words, and where they come from (for the submit line)."""
    sizes = sorted({(p.width, p.height) for p in prompts})
    steps = sorted({p.steps for p in prompts})
    size = f"{sizes[0][0]}x{sizes[0][1]} px" if len(sizes) == 1 else f"{len(sizes)} sizes"
    step = f"{steps[0]} step{'s' if steps[0] != 1 else ''}" if len(steps) == 1 else f"{steps[0]}-{steps[-1]} steps"
    defaulted = [k for k in SETTING_FLAGS if given.get(k) is None]
    source = ""
    if defaulted:
        whose = "the tiny model's" if model == TINY else f"{family}'s"
        source = f" ({whose} defaults where the file gives none; set them with " + \
            "/".join(f"--{k}" for k in defaulted) + ")"
    return f"{size}, {step}{source}"


@dataclass(frozen=True)
class Prompt:
    line: int
    prompt: str
    negative_prompt: str
    seed: int
    count: int
    width: int
    height: int
    steps: int
    guidance: float
    scheduler: str


def _int(v: Any, name: str, where: str, lo: int, hi: int, multiple: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi or v % multiple:
        extra = f", a multiple of {multiple}" if multiple > 1 else ""
        raise UserError(f"{where}: {name} must be an integer from {lo} to {hi}{extra}, got {v!r}")
    return v


def parse_prompts(path: str | Path, family: str, images_per_prompt: int = 1, model: str | None = None,
                  settings: dict[str, Any] | None = None) -> list[Prompt]:
    """The file's prompts, each checked against the model. `settings` (--width, --height, --steps)
    go over the model's defaults; a JSONL line's own fields go over both."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"prompts file {p} does not exist") from None
    except UnicodeDecodeError:
        raise UserError(f"prompts file {p} is not UTF-8 text") from None
    defaults = {**defaults_for(family, model), **check_settings(settings or {}, model)}
    lo, hi, mult, most = limits_for(model)
    out: list[Prompt] = []
    seen: dict[tuple, int] = {}
    jsonl = p.suffix.lower() in (".jsonl", ".ndjson") or text.lstrip().startswith("{")
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or (not jsonl and line.startswith("#")):
            continue
        where = f"{p.name} line {n}"
        if jsonl:
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise UserError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(row, dict):
                raise UserError(f"{where}: each line must be a JSON object with a \"prompt\"")
            unknown = sorted(set(row) - FIELDS)
            if unknown:
                raise UserError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(FIELDS))})")
        else:
            row = {"prompt": line}
        prompt = row.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise UserError(f"{where}: \"prompt\" must be a non-empty string")
        neg = row.get("negative_prompt", "")
        if not isinstance(neg, str):
            raise UserError(f"{where}: \"negative_prompt\" must be a string")
        # Without a seed, one that follows from the prompt: the same file gives the same images.
        seed = _int(row.get("seed", zlib.crc32(prompt.encode()) & 0x7FFFFFFF), "seed", where, 0, 2**32 - 1)
        count = _int(row.get("count", images_per_prompt), "count", where, 1, 10_000)
        width = _int(row.get("width", defaults["width"]), "width", where, lo, hi, mult)
        height = _int(row.get("height", defaults["height"]), "height", where, lo, hi, mult)
        if family == "sd3" and (width % 16 or height % 16):
            # SD3's pipeline takes sides that are multiples of its VAE's 8 times the transformer's patch of 2.
            raise UserError(f"{where}: width and height must be multiples of 16 for SD3, got {width}x{height}")
        steps = _int(row.get("steps", defaults["steps"]), "steps", where, 1, most)
        guidance = row.get("guidance", defaults["guidance"])
        if isinstance(guidance, bool) or not isinstance(guidance, (int, float)) or not 0 <= guidance <= 30:
            raise UserError(f"{where}: guidance must be a number from 0 to 30, got {guidance!r}")
        sched = row.get("scheduler", defaults["scheduler"])
        allowed = FLOW_SCHEDULERS if family == "sd3" else tuple(s for s in SCHEDULERS if s not in FLOW_SCHEDULERS)
        if sched not in allowed:
            raise UserError(f"{where}: scheduler must be one of {', '.join(allowed)}, got {sched!r}")
        pr = Prompt(n, prompt.strip(), neg, seed, count, width, height, steps, float(guidance), sched)
        ident = (pr.prompt, pr.negative_prompt, pr.width, pr.height, pr.steps, pr.guidance, pr.scheduler)
        for s in range(seed, seed + count):
            if (ident, s) in seen:
                raise UserError(f"{where}: repeats line {seen[(ident, s)]} (same prompt, settings and seed {s}); "
                                f"give it another seed")
            seen[(ident, s)] = n
        out.append(pr)
    if not out:
        raise UserError(f"prompts file {p} has no prompts")
    return out


def build_items(prompts: list[Prompt], model: str, lora: str | None) -> list[dict[str, Any]]:
    """Split prompts into work items of up to IMAGES_PER_ITEM consecutive seeds each."""
    items = []
    for pr in prompts:
        settings = {"model": model, "lora": lora, "prompt": pr.prompt, "negative_prompt": pr.negative_prompt,
                    "steps": pr.steps, "guidance": pr.guidance, "width": pr.width, "height": pr.height,
                    "scheduler": pr.scheduler}
        seeds = list(range(pr.seed, pr.seed + pr.count))
        for k in range(0, len(seeds), IMAGES_PER_ITEM):
            items.append({"id": f"i{len(items):07d}", "line": pr.line, "settings": settings,
                          "seeds": seeds[k:k + IMAGES_PER_ITEM]})
    return items
