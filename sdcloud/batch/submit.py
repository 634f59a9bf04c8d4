"""Submitting a batch job: validate the options, split the prompts into work items, write them to
the job's bucket and its row to the state store (a schedule's fire submits under a given id)."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..events import Kind
from ..money import usd
from ..offers.kinds import RunKind
from ..runs.records.run_state import RunState
from ..providers.traits import has_stack, names, traits
from .prompts import build_items, parse_prompts
from .status import on_this_machine, state_store

BATCH_TIERS = {"batch-sd15": "sd15", "batch-sdxl": "sdxl", "batch-sd35": "sd3"}


@dataclass
class SubmitOptions:
    tier: str
    model: str
    prompts: str
    lora: str | None = None
    images_per_prompt: int = 1
    workers: int | None = None     # None: 1, or as many as the deadline needs
    market: str = "spot"
    max_price: float | None = None
    deadline_hours: float | None = None
    budget: float | None = None
    provider: str = "local"
    name: str | None = None
    store: str | None = None
    generator: str = "diffusers"   # "fake": no model (tests and protocol demos)
    fake_delay: float = 0.0        # seconds per fake batch, so a test can catch a worker mid-item
    max_failed_boots: int | None = None  # failed host boots in a row that end the job (None: 3)
    # --width/--height/--steps: over the model's defaults (prompts.defaults_for), under a JSONL line's own.
    width: int | None = None
    height: int | None = None
    steps: int | None = None
    schedule: str | None = None    # the cloud schedule whose fire submitted it (batch/cloud_schedules.py)
    region: str | None = None      # where its hosts launch (a cloud schedule's: its stack's region)
    providers: list[str] | None = None  # several clouds at once, the home first (batch/clouds.py)


def new_job_id() -> str:
    return "b-" + secrets.token_hex(4)


def store_conf(provider: str, store: str | None, region: str | None = None) -> dict:
    """The job's store, chosen as a training run's is (sdcloud.runs.records.store.store_config): --store, this
    machine's bucket folder for local and SSH, else the bucket of `sdcloud infra up` (Tencent: COS with
    its endpoint, virtual addressing and the hosts' CVM role)."""
    from ..runs.records.store import store_config

    infra = state_store().infra(provider, region or "") if provider in names(where=has_stack) and not store else None
    return store_config(provider, store, region, infra)


def validate(opts: SubmitOptions) -> list[dict[str, Any]]:
    """Every check that can fail, before anything is written or launched. Returns the work items."""
    if opts.tier not in BATCH_TIERS:
        tiers = list(BATCH_TIERS)
        raise UserError(f"tier {opts.tier!r} is not a batch tier: use {', '.join(tiers[:-1])} or {tiers[-1]}")
    if opts.workers is not None and opts.workers < 1:
        raise UserError(f"--workers must be at least 1, got {opts.workers}")
    if opts.images_per_prompt < 1:
        raise UserError(f"--images-per-prompt must be at least 1, got {opts.images_per_prompt}")
    if opts.provider not in names():
        raise UserError(f"unknown provider {opts.provider!r}: use {', '.join(names())}")
    opts.cloud_stores = {}
    if opts.providers and len(opts.providers) > 1:
        from . import clouds

        if opts.schedule:
            raise UserError(f"a schedule's job runs in one cloud: its cloud driver holds no keys of the others "
                            f"({','.join(opts.providers)})")
        opts.provider = opts.providers[0]
        # Every named cloud's credentials and each other cloud's bucket, before anything is written.
        opts.cloud_stores = clouds.check(opts.providers, lambda name: store_conf(name, None))
    if opts.max_price is not None:
        opts.max_price = usd(opts.max_price, "--max-price", per_hour=True)
    if opts.budget is not None:
        opts.budget = usd(opts.budget, "--budget")
    if opts.max_failed_boots is not None and opts.max_failed_boots < 1:
        raise UserError(f"--max-failed-boots must be at least 1, got {opts.max_failed_boots}")
    if opts.deadline_hours is not None and opts.deadline_hours <= 0:
        raise UserError("--deadline must be in the future")
    if not opts.model.strip():
        raise UserError("--model must name a model")
    _tiny_of_the_tier(opts)
    if on_this_machine(opts.provider) and opts.model.startswith(("/", ".", "~")) and not Path(opts.model).expanduser().is_dir():
        raise UserError(f"--model {opts.model}: no such folder (a diffusers model folder, a hub id, or tiny)")
    if Path(opts.model).expanduser().is_dir():
        _check_family(opts.model, opts.tier)
    # --lora: a run id (r-...), else a file, else a run's name (what `sdcloud status` shows).
    is_file = bool(opts.lora) and not opts.lora.startswith("r-") and Path(opts.lora).expanduser().is_file()
    lora_run = resolve_lora_run(opts.lora, opts.tier) if opts.lora and not is_file else None
    if is_file:  # a file's family, from its tensor names (lora_file.py), as a run's from its tier
        from .lora_file import check_lora_file

        check_lora_file(opts.lora, opts.tier, BATCH_TIERS[opts.tier], {f: t for t, f in BATCH_TIERS.items()})
    prompts = parse_prompts(opts.prompts, BATCH_TIERS[opts.tier], opts.images_per_prompt, model=opts.model,
                            settings={"width": opts.width, "height": opts.height, "steps": opts.steps})
    opts.prompt_list = prompts  # the submit line states their settings (commands/batch.py)
    items = build_items(prompts, opts.model, lora_run.identity if lora_run else lora_identity(opts.lora))
    opts.lora_run = lora_run
    if opts.workers is None:
        opts.workers = workers_for_deadline(opts, sum(len(it["seeds"]) for it in items), len(items))
    return items


def _tiny_of_the_tier(opts: SubmitOptions) -> None:
    """`tiny-sd3` (as `up` takes it) is the workers' `tiny` of the tier's family: they build the random
    test pipeline by the tier, and took `tiny-sd3` for a hub id, failing every worker offline."""
    from sdcloud_agent.trainers.models import TINY_NAMES

    family = TINY_NAMES.get(opts.model.lower())
    if opts.model == "tiny" or opts.model.lower() not in TINY_NAMES:
        return
    want = BATCH_TIERS[opts.tier]
    if family not in (None, want) and not (want == "sd15" and family == "sd2"):
        raise UserError(f"--model {opts.model} is an {family} model but tier {opts.tier} renders with {want}; "
                        "pick a model of that family or another batch tier")
    opts.model = "tiny"


def _check_family(model: str, tier: str) -> None:
    """A model folder of another family than the tier renders with (an SDXL folder for batch-sd35)."""
    from sdcloud_agent.trainers.models import ModelError, detect_family

    try:
        family = detect_family(str(Path(model).expanduser()))
    except ModelError as exc:
        raise UserError(f"--model {exc}") from None
    want = BATCH_TIERS[tier]
    if family is not None and family != want and not (want == "sd15" and family == "sd2"):
        raise UserError(f"--model {model} is an {family} model but tier {tier} renders with {want}; "
                        "pick a model of that family or another batch tier")


# Plan for the deadline with this share of it, leaving room for a reclaim or two.
DEADLINE_SAFETY = 0.8


def workers_for_deadline(opts: SubmitOptions, images: int, items: int) -> int:
    """K from the estimated throughput of the cheapest fitting offer: enough hosts to finish within
    the deadline (1 without a deadline, or where no catalog knows the hosts: local and SSH)."""
    if opts.deadline_hours is None or not traits(opts.provider).catalog:
        return 1
    from ..offers.catalog import load_catalog
    from ..offers.optimizer import SETUP_HOURS, rank
    from ..offers.tiers import get_tier

    market = None if opts.market == "spot" else "on-demand"
    from ..runs.driving.lessons import user_book

    # The rates recorded here (bench/batch_gpu.py --record, sdcloud speeds add) take the catalog's place.
    ranked = rank(get_tier(opts.tier), load_catalog([opts.provider]), market=market, max_price=opts.max_price,
                  provider=opts.provider, job_size=images, book=user_book())
    if not ranked:
        raise UserError(f"no {opts.provider} offer fits tier {opts.tier}")
    work = max(0.0, ranked[0].est_hours - SETUP_HOURS)  # one host, the whole job
    room = opts.deadline_hours * DEADLINE_SAFETY - SETUP_HOURS
    if room <= 0:
        raise UserError(f"--deadline {opts.deadline_hours:g}h leaves no time after host start-up ({SETUP_HOURS:g}h)")
    import math

    return max(1, min(items, math.ceil(work / room)))


# The LoRA a training run leaves in its artifacts (the builtin trainer's diffusers-format file).
RUN_LORA = "pytorch_lora_weights.safetensors"


@dataclass
class LoraRun:
    run_id: str
    store: Any          # the training run's store
    key: str            # runs/<id>/artifacts/pytorch_lora_weights.safetensors
    identity: str       # what the image keys record: r-...@sha256:<16 hex of the file>


def _check_lora_family(run: dict, lora: str, tier: str) -> None:
    """A run's LoRA is of the family its tier trains (the tier's model family was checked at `up`):
    another family than the batch tier renders with would load into no layer of its model, and the
    images would come out as if without it, with `verify` saying ok."""
    from ..offers.tiers import all_tiers, get_tier

    if run.get("tier") not in all_tiers():
        return  # a tier this version does not know: nothing to compare
    family = get_tier(run["tier"]).family
    want = BATCH_TIERS[tier]
    if family != want and not (want == "sd15" and family == "sd2"):
        fitting = next((t for t, f in BATCH_TIERS.items() if f == family), None)
        raise UserError(f"--lora {lora}: run {run['id']} trained an {family} LoRA (tier {run['tier']}), but {tier} "
                        f"renders with {want}" + (f"; use --tier {fitting}" if fitting else "; use a LoRA of that family"))


def resolve_lora_run(run_id: str, tier: str | None = None) -> LoraRun:
    """`--lora r-...` or `--lora NAME`: that training run, succeeded, and its LoRA artifact in the run's bucket.

    Resolved here, at submit, not on the hosts: only this machine knows the run's state and its
    bucket (a host gets the job's store and nothing else), and a run that cannot serve is refused
    before anything is written or launched. Submit then copies the file into the job's own prefix.
    """
    from ..runs.records import artifacts
    from ..runs.records.store import StoreError

    run = state_store().get_run(run_id)  # an id or a name
    if run is None or RunKind.of(run["spec"]) is RunKind.BATCH:
        what = "no training run with that id" if run_id.startswith("r-") else "neither a LoRA file nor a training run's name"
        raise UserError(f"--lora {run_id}: {what}; see: sdcloud status")
    if run["state"] != RunState.SUCCEEDED:
        raise UserError(f"--lora {run_id}: the run is {run['state']}, not succeeded; its LoRA is not final")
    if tier is not None:
        _check_lora_family(run, run_id, tier)
    store, _url = artifacts._store_and_url(run)
    key = f"runs/{run['id']}/artifacts/{RUN_LORA}"
    try:
        data = store.get(key)
    except StoreError:
        data = None
    if not data:
        raise UserError(f"--lora {run_id}: the run has no LoRA artifact ({RUN_LORA}); see: sdcloud pull {run['id']}")
    import hashlib

    return LoraRun(run["id"], store, key, f"{run['id']}@sha256:{hashlib.sha256(data).hexdigest()[:16]}")


def lora_identity(lora: str | None) -> str | None:
    """What the image keys record of a LoRA: a file by its content (a renamed copy makes the same
    images), a run by its id."""
    if not lora or lora.startswith("r-"):
        return lora
    from sdcloud_agent.store import sha256_file

    path = Path(lora).expanduser().resolve()
    return f"{path.name}@sha256:{sha256_file(path)[:16]}"


def job_prefix(job_id: str) -> str:
    return f"batch/{job_id}"


def submit(opts: SubmitOptions, job_id: str | None = None, state: Any = None, conf: dict | None = None,
           written_ok: bool = False) -> dict[str, Any]:
    """Validate, then write the job's items to the bucket and its row to the state store.

    With a given job_id (a schedule's fire) a second submit of the same id returns the first one.
    The cloud driver passes its own `state` (a cache in the function's /tmp), the store `conf` the
    schedule recorded, and `written_ok`: a fire whose items are already in the bucket (an invocation
    that died before it journaled the job) records the row over them, since the same schedule and
    prompts make the same items.
    """
    items = validate(opts)
    conf = conf or store_conf(opts.provider, opts.store)
    state = state or state_store()
    from sdcloud_agent.batch.worker import write_job

    from ..runs.records.store import open_run_store

    if job_id is not None and state.get_run(job_id) is not None:
        return {"job": job_id, "existing": True}
    job_id = job_id or new_job_id()
    store = open_run_store(conf)
    images = sum(len(it["seeds"]) for it in items)
    lora = str(Path(opts.lora).expanduser().resolve()) if opts.lora and not opts.lora.startswith("r-") else opts.lora
    lora_key = None
    run_lora: LoraRun | None = getattr(opts, "lora_run", None)
    if run_lora is not None:
        # The run's LoRA goes into the job's own prefix: the hosts read only the job's store, and the
        # job keeps the exact file its image keys name even if the run's artifacts are removed later.
        lora, lora_key = run_lora.identity, f"{job_prefix(job_id)}/lora/{RUN_LORA}"
        store.put_if_absent(lora_key, run_lora.store.get(run_lora.key))
    spec = {"kind": str(RunKind.BATCH), "tier": opts.tier, "model": opts.model, "lora": lora, "lora_key": lora_key,
            "workers": opts.workers,
            "market": opts.market, "max_price": opts.max_price, "deadline_hours": opts.deadline_hours,
            "budget": opts.budget, "provider": opts.provider, "store": conf, "prefix": job_prefix(job_id),
            "generator": opts.generator, "fake_delay": opts.fake_delay, "max_failed_boots": opts.max_failed_boots,
            "images": images, "items": len(items), "submitted": time.time(),
            **({"schedule": opts.schedule} if opts.schedule else {}), **({"region": opts.region} if opts.region else {}),
            **({"clouds": opts.providers, "cloud_stores": opts.cloud_stores} if getattr(opts, "cloud_stores", None) else {})}
    try:
        write_job(store, job_prefix(job_id), {k: spec[k] for k in ("tier", "model", "lora", "lora_key", "images",
                                                                 "submitted")}, items)
    except FileExistsError:
        if not written_ok:
            raise
    if spec.get("clouds"):  # the job in each other cloud's store, where that cloud's workers read it
        from .clouds import Relay

        for conf in spec["cloud_stores"].values():
            Relay(store, open_run_store(conf), job_prefix(job_id)).seed(lora_key)
    state.create_run(job_id, opts.tier, spec, images, name=opts.name)
    state.event(job_id, Kind.BATCH_SUBMITTED, {"items": len(items), "images": images, "workers": opts.workers})
    return {"job": job_id, "items": len(items), "images": images, "workers": opts.workers, "store": conf["url"]}
