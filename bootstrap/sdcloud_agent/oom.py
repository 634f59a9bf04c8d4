"""CUDA out-of-memory: recognised in any trainer's output and healed on the same host.

A trainer that dies of CUDA OOM is started again from the newest checkpoint with the next rung of
a ladder of leaner recipes, each through the trainer's own flags (docs/training.md has the table):

    1 gradient-checkpointing  recompute activations in the backward pass (~25-30% slower)
    2 8bit-optimizer          AdamW8bit (bitsandbytes), else Adafactor: the optimizer state shrinks
    3 cache-latents           latents (and SDXL text-encoder outputs) computed once, encoders off
    4 half-batch              half the micro-batch, twice the gradient accumulation (repeated down
                              to a micro-batch of 1); the samples per optimizer step never change

A rung that the trainer already uses, or whose flag its script does not accept
(data/trainer-options.json), is passed over. When no rung is left the attempt ends with reason
out-of-memory and the controller moves to an offer with more usable VRAM. The recipe that worked
is written to `<run prefix>/recipe.json` and read by the run's next attempts.

Pure: no torch; the agent feeds it lines and asks for the next recipe.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from .oom_detect import OOM_LINE, OOM_TEXT, START_LINE, Detector, OomSeen, scan  # noqa: F401 - the names callers use
from .oom_rules import fresh_optimizer_refusal, has_bitsandbytes, script_options, te_cache_blocker
from .oom_rules import lookup as _lookup

log = logging.getLogger("sdcloud_agent.oom")

RUNGS = ("gradient-checkpointing", "8bit-optimizer", "cache-latents", "half-batch")
RECIPE_KEY = "recipe.json"


# ---------------------------------------------------------------------------------------------
# The recipe and the ladder


@dataclass
class Recipe:
    """The memory savings the ladder added over the user's own flags."""
    rungs: list[str] = field(default_factory=list)  # in the order they were climbed
    gradient_checkpointing: bool = False
    optimizer: str | None = None  # "adamw8bit" or "adafactor"
    # The checkpoint step the optimizer changed at: checkpoints up to it hold the old optimizer's
    # state, so a resume from one of them starts the new optimizer fresh (None: none existed).
    optimizer_step: int | None = None
    cache: bool = False
    batch_size: int | None = None  # the micro-batch, when the ladder changed it
    grad_accum: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Recipe":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


def _int(v: Any, default: int) -> int:
    try:
        return default if v is None or isinstance(v, bool) else int(v)
    except (TypeError, ValueError):
        return default


def _halve(batch: int) -> int | None:
    """The largest divisor of `batch` at most half of it (3 -> 1, 8 -> 4), None at 1."""
    if batch <= 1:
        return None
    return max(d for d in range(1, batch // 2 + 1) if batch % d == 0)


class Ladder:
    """One trainer's ladder: what each rung changes, through that trainer's flags."""

    def __init__(self, trainer: str, trainer_args: Any, *, script_options: dict | None = None,
                 has_bitsandbytes: bool = False, cuda: bool = True):
        self.trainer = trainer
        self.args = trainer_args if isinstance(trainer_args, (dict, list)) else {}
        self.options = script_options  # {"--flag": kind} of an external script, None: unknown
        self.bnb = has_bitsandbytes
        self.cuda = cuda
        # What the trainer ran with, where it says (the builtin trainer's GPU recipe fills unset
        # flags): a rung already in force there is passed over, and the micro-batch halves from it.
        self.effective: dict = {}
        self.passed: list[dict] = []  # [{"rung", "why"}] of the last step(): rungs that could not apply
        self.checkpoint: int | None = None

    def _accepts(self, flag: str) -> bool:
        if self.trainer in ("builtin", "command"):
            return True
        return self.options is None or f"--{flag}" in self.options

    def _batch(self, recipe: Recipe) -> tuple[int, int]:
        names = {"builtin": (("batch-size",), ("grad-accum",))}.get(
            self.trainer, (("train_batch_size", "batch_size"), ("gradient_accumulation_steps", "grad_accum")))
        eff = self.effective
        b = recipe.batch_size or _int(eff.get("batch_size"), 0) or _int(_lookup(self.args, *names[0]), 1)
        a = recipe.grad_accum or _int(eff.get("grad_accum"), 0) or _int(_lookup(self.args, *names[1]), 1)
        return b, a

    def step(self, recipe: Recipe, *, checkpoint: int | None = None) -> tuple[Recipe, str, str] | None:
        """(the next recipe, its rung, what changed in words), or None when the ladder is spent.
        `checkpoint`: the step of the checkpoint the restart resumes from (None: a fresh start).
        A rung passed over for a reason the user should know is kept in `passed`."""
        if self.trainer == "command" and not (isinstance(self.args, dict) and self.args.get("memory_ladder")):
            return None  # any command: restarting it unchanged would fail the same way
        self.passed = []
        self.checkpoint = checkpoint
        done = set(recipe.rungs)
        for rung in RUNGS:
            if rung in done and rung != "half-batch":
                continue
            change = self._try(rung, recipe)
            if change is not None:
                new, text = change
                new.rungs = [*recipe.rungs, rung]
                return new, rung, text
        return None

    def _try(self, rung: str, r: Recipe) -> tuple[Recipe, str] | None:
        a, t = self.args, self.trainer
        new = Recipe.from_dict(r.as_dict())
        if rung == "gradient-checkpointing":
            if (_lookup(a, "gradient_checkpointing") is True or self.effective.get("gradient_checkpointing")
                    or not self._accepts("gradient_checkpointing")):
                return None
            new.gradient_checkpointing = True
            return new, "gradient checkpointing on"
        if rung == "8bit-optimizer":
            if t == "builtin":
                cur = str(self.effective.get("optimizer") or _lookup(a, "optimizer") or "adamw").lower()
                if cur != "adamw":
                    return None
                new.optimizer = "adamw8bit" if (self.bnb and self.cuda) else "adafactor"
            elif t == "kohya":
                cur = str(_lookup(a, "optimizer_type") or "AdamW").lower()
                if _lookup(a, "use_8bit_adam") is True or cur not in ("adamw", ""):
                    return None
                new.optimizer = "adamw8bit" if self.bnb else "adafactor"
            elif t == "diffusers":
                # The example scripts offer no Adafactor: without bitsandbytes this rung is passed over.
                if _lookup(a, "use_8bit_adam") is True or not self._accepts("use_8bit_adam") or (
                        not self.bnb and self.checkpoint is None):
                    return None  # (after a checkpoint the reason below is said even without bitsandbytes)
                new.optimizer = "adamw8bit"
            else:
                new.optimizer = "adamw8bit" if self.bnb else "adafactor"
            if self.checkpoint is not None:
                why = fresh_optimizer_refusal(t, a, self.options)
                if why is not None:
                    self.passed.append({"rung": rung, "why": why})
                    return None
                new.optimizer_step = self.checkpoint  # the restart starts this optimizer fresh
            return new, {"adamw8bit": "optimizer AdamW -> AdamW8bit",
                         "adafactor": "optimizer AdamW -> Adafactor (no bitsandbytes)"}[new.optimizer]
        if rung == "cache-latents":
            if t == "builtin":
                return None  # it always encodes the dataset once and moves the encoders off the GPU
            if t == "kohya":
                # kohya refuses cached latents with per-step image augmentation (train_util asserts).
                if (_lookup(a, "cache_latents") is True or _lookup(a, "random_crop") is True
                        or _lookup(a, "color_aug") is True or not self._accepts("cache_latents")):
                    return None
            elif t == "diffusers" and not self._accepts("cache_latents"):
                return None  # the pinned example scripts have no such flag
            new.cache = True
            blocker = te_cache_blocker(a) if t == "kohya" and self._accepts("cache_text_encoder_outputs") else None
            if blocker and self.options is not None:
                self.passed.append({"rung": "cache-text-encoder-outputs",
                                    "why": f"kohya asserts the text-encoder outputs are cacheable, false with {blocker}"})
            return new, "latents cached" + (" and text-encoder outputs cached" if self._te_cache() else "")
        if rung == "half-batch":
            b, acc = self._batch(r)
            half = _halve(b)
            if half is None:
                return None
            new.batch_size, new.grad_accum = half, acc * (b // half)
            return new, (f"micro-batch {b} -> {half}, gradient accumulation {acc} -> {new.grad_accum} "
                         f"(effective batch {b * acc} unchanged)")
        return None

    def _te_cache(self) -> bool:
        """kohya's SDXL scripts cache the text encoders' outputs too, where the text encoders are
        not trained: a network script must be told --network_train_unet_only by the user (caching
        would otherwise change what is trained), sdxl_train.py must not train them; and no option
        may make the text vary per step (oom_rules.te_cache_blocker: kohya asserts on it)."""
        if self.trainer != "kohya" or not self._accepts("cache_text_encoder_outputs") or self.options is None:
            return self.trainer == "command"
        if _lookup(self.args, "cache_text_encoder_outputs") is True:
            return False
        if "--network_train_unet_only" in self.options:
            wanted = _lookup(self.args, "network_train_unet_only") is True
        else:
            wanted = _lookup(self.args, "train_text_encoder") is not True
        return wanted and te_cache_blocker(self.args) is None

    # -- applying it -----------------------------------------------------------------------------
    def apply(self, recipe: Recipe) -> Any:
        """trainer_args with the recipe's flags set (the user's other flags unchanged)."""
        t = self.trainer
        if t == "command":
            return self.args  # told through SDCLOUD_MEMORY_RECIPE (environment)
        flags: dict[str, Any] = {}
        if t == "builtin":
            if recipe.gradient_checkpointing:
                flags["gradient-checkpointing"] = True
            if recipe.optimizer:
                flags["optimizer"] = recipe.optimizer
                # The checkpoint holds AdamW state: the new optimizer starts its own (builtin/checkpoints.py).
                flags["optimizer-change"] = True
            if recipe.batch_size:
                flags["batch-size"], flags["grad-accum"] = recipe.batch_size, recipe.grad_accum
        else:
            if recipe.gradient_checkpointing:
                flags["gradient_checkpointing"] = True
            if recipe.optimizer:
                if t == "kohya":
                    flags["optimizer_type"] = "AdamW8bit" if recipe.optimizer == "adamw8bit" else "Adafactor"
                    if recipe.optimizer == "adafactor":
                        # Adafactor with a fixed learning rate, as kohya's docs give it.
                        flags["optimizer_args"] = ["scale_parameter=False", "relative_step=False",
                                                   "warmup_init=False"]
                else:
                    flags["use_8bit_adam"] = True
            if recipe.cache:
                flags["cache_latents"] = True
                if self._te_cache():
                    flags["cache_text_encoder_outputs"] = True
            if recipe.batch_size:
                flags["train_batch_size"], flags["gradient_accumulation_steps"] = recipe.batch_size, recipe.grad_accum
        if isinstance(self.args, dict):
            out = {k: v for k, v in self.args.items()
                   if str(k).lstrip("-").replace("_", "-") not in {f.replace("_", "-") for f in flags}}
            if t == "builtin":
                out = {k: v for k, v in out.items() if str(k).lstrip("-").replace("_", "-") != "no-gradient-checkpointing"}
            return {**out, **flags}
        # An argv list: argparse takes the last value, so the recipe's flags go at the end.
        from .trainers.base import flag_args

        return [*self.args, *flag_args(flags)]


def environment(recipe: Recipe) -> dict[str, str]:
    """What a `command` trainer is told: the recipe as JSON (it applies what it can)."""
    return {"SDCLOUD_MEMORY_RECIPE": json.dumps(recipe.as_dict(), sort_keys=True)} if recipe.rungs else {}


# ---------------------------------------------------------------------------------------------
# The recipe kept in the run's prefix


def load(store: Any, run_prefix: str) -> Recipe | None:
    """The recipe an earlier attempt of this run healed to, or None."""
    try:
        data = store.get(f"{run_prefix}/{RECIPE_KEY}")
    except Exception:  # noqa: BLE001 - absent (or unreadable): start from the user's own flags
        return None
    if not data:
        return None
    try:
        return Recipe.from_dict(json.loads(data))
    except (ValueError, TypeError):
        log.warning("ignoring an unreadable %s", RECIPE_KEY)
        return None


def save(store: Any, run_prefix: str, recipe: Recipe) -> None:
    store.put(f"{run_prefix}/{RECIPE_KEY}", json.dumps(recipe.as_dict(), sort_keys=True).encode())


# ---------------------------------------------------------------------------------------------
# The agent's side: one per attempt


class Healer:
    """Holds the attempt's recipe; climbs one rung per OOM and keeps the recipe in the store."""

    def __init__(self, trainer: str, trainer_args: Any, *, store: Any = None, run_prefix: str = "",
                 python: str | None = None, cuda: bool = True):
        self.trainer = trainer
        self.base_args = trainer_args
        self.store, self.run_prefix = store, run_prefix
        self.python, self.cuda = python, cuda
        self._bnb_known = not cuda  # asked at the first out-of-memory: most runs never need it
        self.ladder = Ladder(trainer, trainer_args, script_options=script_options(trainer, trainer_args),
                             has_bitsandbytes=False, cuda=cuda)
        self.recipe = Recipe()
        self.events: list[dict] = []
        self.passed: list[dict] = []  # rungs passed over, with why (also on the spent ladder)
        self.extra_flags: dict = {}  # set by a health action (health_act.py) over the recipe's

    def start(self) -> tuple[Any, dict[str, str]]:
        """(trainer_args, environment) for the first start: with the recipe an earlier attempt
        healed to, if there is one."""
        kept = load(self.store, self.run_prefix) if self.store is not None else None
        if kept is not None and kept.rungs:
            self.recipe = kept
            log.info("memory recipe kept from an earlier attempt: %s", ", ".join(kept.rungs))
        return self.ladder.apply(self.recipe), environment(self.recipe)

    def climb(self, seen: OomSeen | None, *, step: int | None, peak_gb: float | None = None,
              effective: dict | None = None, checkpoint: bool = True) -> dict | None:
        """The next rung's event ({"rung", "change", "peak_gb", ...}) with the recipe moved on, or
        None when the ladder is spent. `effective`: the settings the trainer said it ran with;
        `checkpoint`: whether the restart resumes from a checkpoint at `step`."""
        if effective:
            self.ladder.effective = dict(effective)
        if not self._bnb_known:
            self.ladder.bnb, self._bnb_known = has_bitsandbytes(self.python), True
        nxt = self.ladder.step(self.recipe, checkpoint=step if checkpoint and step else None)
        self.passed += [p for p in self.ladder.passed if p not in self.passed]
        if nxt is None:
            return None
        self.recipe, rung, change = nxt
        peaks = [p for p in (peak_gb, seen.peak_gb if seen else None) if p is not None]
        ev = {"rung": rung, "change": change, "peak_gb": max(peaks) if peaks else None,
              "total_gb": seen.total_gb if seen else None, "resume_step": step,
              "n": len(self.events) + 1, "error": (seen.line if seen else "")[:300]}
        if self.ladder.passed:
            ev["passed_over"] = list(self.ladder.passed)
        if rung == "8bit-optimizer" and self.recipe.optimizer_step is not None:
            ev["fresh_optimizer"] = True  # weights and step from the checkpoint, not its optimizer state
        self.events.append(ev)
        if self.store is not None:
            try:
                save(self.store, self.run_prefix, self.recipe)
            except Exception as exc:  # noqa: BLE001 - this attempt heals anyway; the next re-climbs
                log.warning("cannot keep the memory recipe: %s", exc)
        return ev

    def fresh_optimizer(self, resume_step: int | None) -> bool:
        """Whether a resume from the checkpoint at `resume_step` must start the optimizer fresh:
        the recipe changed it, and that checkpoint was saved by the old one."""
        r = self.recipe
        return bool(r.optimizer and r.optimizer_step is not None and resume_step is not None
                    and resume_step <= r.optimizer_step)

    def adopt(self, rung: str) -> str | None:
        """Climb `rung` for another reason than an out-of-memory (a health action: cached latents
        for an io-bound run); kept in the recipe like a climbed rung. Its change, or None."""
        got = self.ladder._try(rung, self.recipe)
        if got is None:
            return None
        new, change = got
        new.rungs = [*self.recipe.rungs, rung]
        self.recipe = new
        if self.store is not None:
            try:
                save(self.store, self.run_prefix, self.recipe)
            except Exception as exc:  # noqa: BLE001 - the next attempt goes without it
                log.warning("cannot keep the recipe: %s", exc)
        return change

    def args(self) -> tuple[Any, dict[str, str]]:
        args = self.ladder.apply(self.recipe)
        if self.extra_flags:
            if isinstance(args, dict):
                args = {**args, **self.extra_flags}
            elif isinstance(args, list):
                from .trainers.base import flag_args

                args = [*args, *flag_args(self.extra_flags)]
        return args, environment(self.recipe)
