"""What `sdcloud up` (and `resume`, `batch submit`) checks before anything is created: no run row,
no bucket object, no host. Each refusal is one UserError line with the figures it compared.

- trainer flags against the chosen trainer's own parser: the builtin trainer's argparse parser
  (imported from the agent, pure), kohya's and diffusers' option names read from their pinned
  sources (sdcloud_agent/data/trainer-options.json);
- the store URL (s3://, cos://, file:///): a form the object store opens and a host can reach;
- on this machine and SSH hosts (clouds: commands/run.py checks the ranked catalog), a budget that
  cannot pay for the controller's first polls, and a deadline shorter than the estimate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


from ...errors import UserError
from ...offers.tiers import Tier
from ...providers.traits import is_cloud, names

# -- the store (its URL is checked in runs/records/store_urls.py; spec, batch and the tests import it here) --
from ..records.store_urls import check_store_url  # noqa: E402,F401


# -- trainer flags -------------------------------------------------------------------------------

class _Refused(Exception):
    pass


def _raising_parser():
    from sdcloud_agent.trainers.builtin import build_parser

    parser = build_parser()

    def error(message: str):  # argparse prints its usage and exits 2; here it is one line
        raise _Refused(message)

    parser.error = error  # type: ignore[method-assign]
    return parser


def _builtin_argv(spec: Any, tier: Tier, total_steps: int) -> list[str]:
    """The builtin trainer's flags exactly as the agent's adapter will build them (placeholder paths)."""
    from sdcloud_agent.trainers.base import Context
    from sdcloud_agent.trainers.builtin_adapter import BuiltinTrainer

    from .training import trainer_args_for

    work = Path("/nonexistent/sdcloud-preflight")
    ctx = Context(steps=total_steps, checkpoint_every=spec.checkpoint_every or 1, model=str(spec.model),
                  workdir=work, checkpoint_dir=work / "checkpoints", output_dir=work / "output",
                  dataset=work / "dataset" if spec.dataset else None, trainer_args=trainer_args_for(spec, tier),
                  gpus=1)
    cmd = BuiltinTrainer().command(ctx)
    return cmd[cmd.index("sdcloud_agent.trainers.builtin") + 1:]


def check_builtin_args(spec: Any, tier: Tier, total_steps: int) -> None:
    parser = _raising_parser()
    argv = _builtin_argv(spec, tier, total_steps)
    options = [o for o in parser._option_string_actions if o.startswith("--")]
    from sdcloud_agent.trainers.options import resolve, suggestion

    for token in argv:
        if token.startswith("--") and len(resolve(token.split("=", 1)[0], options)) != 1:
            flag = token.split("=", 1)[0]
            hint = suggestion(flag, options) or "; see: python -m sdcloud_agent.trainers.builtin --help"
            raise UserError(f"--trainer-arg {flag.lstrip('-')}: the builtin trainer has no flag {flag}{hint}")
    from sdcloud_agent.trainers import builtin

    try:
        builtin.parse_args(argv, parser)
    except _Refused as exc:
        raise UserError(f"--trainer-arg: the builtin trainer refuses its flags: {exc}") from None


def check_script_args(spec: Any, tier: Tier) -> None:
    """kohya and diffusers: every key of trainer_args is a flag of the script (by the pinned sources)."""
    from sdcloud_agent.trainers import options
    from sdcloud_agent.trainers.kohya import OURS as KOHYA_OURS

    from .training import trainer_args_for

    args = trainer_args_for(spec, tier)
    if not isinstance(args, dict):
        return  # training.check_trainer_args refuses an argv list for these
    launcher = args.get("launcher")
    if launcher is not None:
        words = launcher.split() if isinstance(launcher, str) else [str(a) for a in launcher]
        if words[:2] != ["accelerate", "launch"]:
            return  # a launcher of the user's: the script is theirs to run as they like
    script = str(args.get("script") or ("sdxl_train_network.py" if spec.trainer == "kohya" else "train_dreambooth_lora_sdxl.py"))
    if Path(script).is_absolute() or options.script_options(spec.trainer, script) is None:
        return  # not a script the table knows (the user's own, or another of the repository's)
    skip = ("script", "launcher", *(KOHYA_OURS if spec.trainer == "kohya" else ()))
    user = spec.trainer_args if isinstance(spec.trainer_args, dict) else {}
    # The user's flags first, one by one; then the tier's defaults (a LoRA tier's network flags on a
    # full fine-tune script are the user's choice of script, said so).
    found = options.problems(spec.trainer, script, {k: v for k, v in args.items() if k in user}, skip=skip,
                             settled={"mixed_precision": ("auto",)})
    if not found:
        theirs = options.problems(spec.trainer, script, {k: v for k, v in args.items() if k not in user}, skip=skip,
                                  settled={"mixed_precision": ("auto",)})
        found = [f"{t} (a default of tier {tier.name}: pick a script for {tier.mode})" for t in theirs]
    if found:
        meta = options.table()[spec.trainer]
        what = "sd-scripts" if spec.trainer == "kohya" else "diffusers examples"
        raise UserError(f"--trainer-arg: {found[0]} ({what} {meta.get('ref') or meta['commit'][:12]}"
                        + (f"; {len(found) - 1} more problem{'s' if len(found) > 2 else ''}" if len(found) > 1 else "")
                        + ")")


def check_trainer_flags(spec: Any, tier: Tier, total_steps: int) -> None:
    """The run's trainer flags against its trainer's own parser (the command trainer: nothing to check)."""
    if spec.trainer == "builtin":
        check_builtin_args(spec, tier, total_steps)
    elif spec.trainer in ("kohya", "diffusers"):
        check_script_args(spec, tier)


# -- this machine and SSH hosts: budget and deadline ---------------------------------------------

def _step_seconds(spec: Any) -> float | None:
    """The builtin trainer's pace on the local provider's tiny model (runs/inputs/training.py), or None."""
    from .training import DEMO_STEP_SECONDS, on_this_machine

    if spec.trainer != "builtin" or not on_this_machine(spec.provider) or not str(spec.model).startswith("tiny"):
        return None
    args = spec.trainer_args
    given = None
    if isinstance(args, dict):
        given = next((v for k, v in args.items() if str(k).lstrip("-").replace("_", "-") == "min-step-seconds"), None)
    elif isinstance(args, list):
        words = [str(a) for a in args]
        for i, w in enumerate(words):
            if w.split("=", 1)[0] in ("--min-step-seconds", "--min_step_seconds"):
                given = w.split("=", 1)[1] if "=" in w else (words[i + 1] if i + 1 < len(words) else None)
    try:
        return float(given) if given is not None else DEMO_STEP_SECONDS
    except ValueError:
        return DEMO_STEP_SECONDS


def _usd(x: float) -> str:
    return "$" + (f"{x:.8f}".rstrip("0").rstrip(".") or "0")


def _hours(h: float) -> str:
    return f"{h * 60:.1f} min" if h < 1 else f"{h:.2f} h"


def check_own_hosts(spec: Any, tier: Tier, total_steps: int, offers: list) -> None:
    """Local and SSH providers: their offers are this machine or the hosts file, priced by the user."""
    if spec.provider in names(where=is_cloud) or not offers:
        return
    if spec.budget is not None:
        from ...fleet.lifecycle import Timing

        poll = Timing.for_provider(spec.provider).poll_seconds
        cheapest = min(offers, key=lambda o: o.price_per_hour_usd)
        price = cheapest.price_per_hour_usd
        # The controller stops once less than two polls' worth of the host's price is left
        # (budget_watch.budget_spent): a budget under that stops the run on its first look.
        floor = price * 2 * poll / 3600
        if price > 0 and spec.budget < floor:
            import math

            least = math.ceil(floor * 1e6) / 1e6
            raise UserError(f"--budget {_usd(spec.budget)} is below two polls ({poll:g} s each) of the cheapest offer, "
                            f"{cheapest.row.instance_type} at {_usd(price)}/h: {_usd(floor)}; the controller would "
                            f"stop the run at once; give at least --budget {least:.6f}")
    if spec.deadline_hours is not None:
        pace = _step_seconds(spec)
        best: tuple[float, str] | None = None
        if pace:
            # The tiny model on this machine is paced, whatever the hardware: steps x pace.
            best = (total_steps * pace / 3600, f"{total_steps} steps at {pace:g} s a step (the tiny model's pace "
                                               f"on the local provider)")
        else:
            from ...offers.optimizer import job_hours
            from ..records.books import user_book
            from .training import gpus_used

            book = user_book(spec.trainer)  # the figures `offers` ranks by
            for offer in offers:
                hours = job_hours(tier, offer.row, total_steps, gpus_used(spec), book)
                if hours is not None and (best is None or hours < best[0]):
                    best = (hours, f"{total_steps} steps on {offer.row.instance_type} ({offer.row.gpu})")
        if best is not None and spec.deadline_hours < best[0]:
            raise UserError(f"--deadline {_hours(spec.deadline_hours)} is shorter than the estimate on the fastest "
                            f"offer: {_hours(best[0])} for {best[1]}")
