"""`sdcloud up` and `sdcloud resume`: start or continue a training run, and drive it here.

The flags become a typed `UpOptions` at the edge; the run spec (runs/inputs/spec.py) is built from them,
the run file and config.toml [defaults]. What a run looks like while it goes is
verbs/progress_view.py; how it is stopped, verbs/stop.py. `status`, `watch`, `logs`, `down` and
`ssh` are their own modules beside this one.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from ..errors import UserError
from ..render import emit_json, note, output_options
from ..runs.inputs import clouds  # a run across clouds: its checks before anything is recorded
from ..runs.inputs.estimates import check_estimates as _check_estimates  # the tests call it by this name too
from ..runs.records.run_state import RESUMABLE_RUN_STATES, RunState
from .common import (EXIT_INTERRUPTED, EXIT_NOT_SUCCEEDED, TRAIN_TIER_NAMES, USD, USD_PER_HOUR, ProvidersHelp,
                     complete_providers, complete_regions, complete_runs, complete_tiers, find_run, market_of,
                     market_options, sample_options, state_store)


@dataclass(frozen=True)
class UpOptions:
    """`sdcloud up`'s flags, typed at the CLI's edge. None is "not given": the run file, then
    config.toml [defaults], then the tier decide. Amounts are checked where they are read (--budget,
    --max-price: commands.common.USD); durations and counts are checked by the spec, as the run
    file's are."""
    tier: str | None = None
    market: str | None = None
    max_price: float | None = None
    provider: str | None = None
    region: str | None = None
    deadline: str | None = None
    budget: float | None = None
    name: str | None = None
    dataset: str | None = None
    trainer: str | None = None
    model: str | None = None
    trainer_arg: tuple[str, ...] = ()
    steps: str | None = None
    checkpoint_every: str | None = None
    store: str | None = None
    simulate_preemption: str | None = None
    self_end_grace: str | None = None
    runfile: str | None = None
    detach: bool = False
    unattended: bool | None = None  # None: config.toml [defaults] unattended
    yes: bool = False
    as_json: bool = False
    nodes: str | None = None
    sample_prompt: tuple[str, ...] = ()  # --sample-prompt, --sample-every, --sample-seed, --report-to (common.py)
    sample_every: str | None = None
    sample_seed: str | None = None
    report_to: str | None = None

    def spec_fields(self) -> dict:
        """The run spec's fields these flags set (None where not given); local paths made absolute here,
        where the user typed them."""
        return {"tier": self.tier, "market": self.market, "max_price": self.max_price, "provider": self.provider,
                "region": self.region, "deadline_hours": self.deadline, "budget": self.budget, "name": self.name,
                "dataset": _local_path(self.dataset), "trainer": self.trainer, "model": _local_path(self.model),
                "steps": self.steps, "checkpoint_every": self.checkpoint_every, "store": self.store,
                "simulate_preemption": self.simulate_preemption, "self_end_grace": self.self_end_grace,
                "trainer_arg": list(self.trainer_arg) or None, "nodes": self.nodes,
                "sample_prompts": list(self.sample_prompt) or None, "sample_every": self.sample_every,
                "sample_seed": self.sample_seed, "report_to": self.report_to}


def _warn_if_prices_old(provider: str) -> None:
    """One stderr line when the catalog that picks the offer is older than [catalog] max_age_days."""
    from ..providers.traits import traits

    if traits(provider).catalog:
        from ..offers.catalog import load_catalog, stale_warning

        warning = stale_warning(load_catalog([provider]).sources)
        if warning:
            note(warning, wrap=True)


def _local_path(value: str | None) -> str | None:
    """A local path made absolute against the directory the user is in (a URL or a model id is left alone)."""
    if not value or "://" in value:
        return value
    path = Path(value).expanduser()
    return str(path.resolve()) if path.exists() else value


def _run_ended(state, run_id: str, as_json: bool, interrupted: bool = False) -> None:
    from ..runs.records.summary import summary
    from .status import render_summary

    summ = summary(state, run_id)
    if summ["state"] == RunState.SUCCEEDED:
        from ..runs.records.artifacts import location

        try:
            summ["artifacts"] = location(state.get_run(run_id))
        except Exception:  # noqa: BLE001 - the summary stands without it
            summ["artifacts"] = None
        summ["pull"] = f"sdcloud pull {run_id}"
    if as_json:
        emit_json(summ)
    else:
        render_summary(summ)
        if summ.get("artifacts"):
            from ..render import echo

            # Wrapped at the terminal (a long path broken after a '/'), as every line of the summary is.
            echo(f"the model is in {summ['artifacts']}; download it with: sdcloud pull {run_id} [DIR]")
    if interrupted:
        raise SystemExit(EXIT_INTERRUPTED)
    if summ["state"] != RunState.SUCCEEDED:
        raise SystemExit(EXIT_NOT_SUCCEEDED)


def drive(state, run_id: str, detach: bool, as_json: bool, take_over: bool = False, hand_back: bool = False) -> None:
    """Drive a run to its end here (or in the background with --detach), then report it. With
    `hand_back` (watch --drive), Ctrl-C gives the run back to its daemon or the cloud driver."""
    from ..providers.capabilities import Closable
    from ..runs.driving.background import detach as detach_run
    from ..runs.driving.controller import Controller
    from ..verbs.progress_view import ProgressView
    from ..verbs.stop import stop_here

    if detach:
        pid = detach_run(run_id)
        if as_json:
            emit_json({"run": run_id, "controller_pid": pid, "state": RunState.RUNNING})
        else:
            click.echo(f"run {run_id} continues in the background (pid {pid}); follow it with: sdcloud watch {run_id}")
        return
    view = ProgressView(state.get_run(run_id)["total_steps"], quiet=as_json)
    ctl = Controller(state, run_id, emit=view)
    previous = signal.signal(signal.SIGTERM, lambda *_: ctl.request_stop("stopped: the controller got SIGTERM"))
    interrupted = False
    try:
        try:
            ctl.run(take_over=take_over)
        except KeyboardInterrupt:
            if hand_back:
                from ..verbs.handover import hand_back as give_back

                name = state.get_run(run_id).get("name") or run_id
                to = give_back(ctl)
                view.close()
                note(f"stopped driving run {run_id} here; it continues, driven by {to} "
                     f"(sdcloud watch {name} to follow it, sdcloud down {name} to stop it)")
                raise SystemExit(EXIT_INTERRUPTED)
            # Ctrl-C stops the run cleanly: the host saves and is terminated. A second Ctrl-C does
            # not cut the stop short (that would leave a host billing): it says what is going on.
            interrupted = True
            name = state.get_run(run_id).get("name") or run_id

            def again(*_):
                note(f"still stopping run {run_id}: the host is saving its checkpoint and will be terminated; "
                     f"if this is cut short, stop it with: sdcloud down {name}")

            signal.signal(signal.SIGINT, again)
            note(f"stopping run {run_id}: saving the checkpoint and terminating the host ...")
            ctl.request_stop("interrupted")
            stop_here(ctl, "interrupted (Ctrl-C); checkpoint kept")
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        ctl.lease.release()  # after a Ctrl-C too: the next driver need not wait for the lease to lapse
        view.close()
        if isinstance(ctl.provider, Closable):
            ctl.provider.close()
    _run_ended(state, run_id, as_json, interrupted)


@click.command()
@output_options
@click.option("--tier", metavar="TIER", shell_complete=complete_tiers, help=f"Training tier: {', '.join(TRAIN_TIER_NAMES)}.")
@market_options
@click.option("--max-price", type=USD_PER_HOUR, metavar="USD", help="Highest spot price per hour, USD.")
@click.option("--provider", metavar="PROVIDER", shell_complete=complete_providers, cls=ProvidersHelp,
              help="{all} (default: local); aws,tencent: the run may move between clouds.")
@click.option("--region", metavar="REGION", shell_complete=complete_regions, help="Region (clouds only; default: any).")
@click.option("--deadline", metavar="DURATION", help="Finish within this long, e.g. 36h, 1d12h, 90m.")
@click.option("--budget", type=USD, metavar="USD", help="Stop before spending more than this many USD (checkpoint kept).")
@click.option("--name", metavar="NAME", shell_complete=complete_runs,
              help="A name for the run (letters, digits, . _ -; not an id); an unfinished, stopped or failed one is continued.")
@click.option("--dataset", metavar="PATH", help="Images (and captions): a local folder or s3:// / cos:// URL.")
@click.option("--trainer", metavar="TRAINER", help="builtin (default), diffusers, kohya or command.")
@click.option("--model", metavar="MODEL", help="Base model: a hub id, a .safetensors file, a diffusers folder or a bucket URL "
              "(default: the tier's base model; tiny on the local provider).")
@click.option("--trainer-arg", "trainer_arg", multiple=True, metavar="KEY=VALUE",
              help="A flag for the trainer (repeatable), e.g. --trainer-arg instance_prompt='a photo of sks dog'.")
@click.option("--steps", metavar="N", help="Training steps (default: the tier's reference job).")
@click.option("--checkpoint-every", metavar="N", help="Save a checkpoint every N steps.")
@click.option("--store", metavar="URL", help="Bucket URL for checkpoints instead of the stack's "
              "(s3://BUCKET/PREFIX, cos://BUCKET-APPID/PREFIX or file:///DIR).")
@click.option("--simulate-preemption", metavar="SECONDS",
              help="Local provider: announce a reclaim this many seconds after the first attempt starts training.")
@click.option("--self-end-grace", metavar="DURATION",
              help="How long a finished host waits for this controller before it ends itself (default 10m; 0: at once).")
@click.option("-f", "--file", "runfile", metavar="PATH", help="Run file (YAML or TOML) with the same fields; flags override it.")
@click.option("--detach", is_flag=True, help="Run the controller in the background; follow with sdcloud watch RUN.")
@click.option("--unattended", is_flag=True, default=None,
              help="Hand the run to the cloud driver at once (sdcloud infra up deploys it): nothing runs here.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation before launching paid hosts.")
@click.option("--json", "as_json", is_flag=True, help="Print the final summary as JSON.")
@click.option("--nodes", metavar="N", help="Train on N hosts together (data-parallel through a rendezvous; docs/training.md).")
@sample_options
def up(spot: bool | None, on_demand: bool | None, **flags) -> None:
    """Run a training job: pick the offer, launch, survive reclaims, report the cost."""
    opts = UpOptions(market=market_of(spot, on_demand), **flags)
    from .. import config
    from ..runs.driving.background import controller_alive
    from ..runs.records.state import ACTIVE_RUN_STATES

    fields = opts.spec_fields()
    state = state_store()
    existing = state.get_run(opts.name) if opts.name else None
    if existing and existing["state"] in RESUMABLE_RUN_STATES:
        _resume(state, existing, fields, opts.runfile, opts.detach, opts.as_json)
        return
    from ..runs.inputs.spec import build_spec, load_runfile

    in_file = set(load_runfile(_local_path(opts.runfile))) if opts.runfile else set()
    defaults = config.defaults()
    unattended = opts.unattended
    if unattended is None:
        unattended = defaults.pop("unattended", "false") == "true"  # config.defaults() checked it
    defaults.pop("unattended", None)
    if unattended and opts.detach:
        raise UserError("--unattended and --detach both say who drives the run: choose one")
    for key, value in defaults.items():  # [defaults] in config.toml: below the run file and the flags
        if fields.get(key) is None and key not in in_file and not clouds.named_here(key, fields, in_file):
            fields[key] = value
    plan = build_spec(_local_path(opts.runfile), fields)
    spec = plan.spec
    if unattended:  # before anything is asked, created or recorded: the driver must be deployed already
        from ..verbs.handover import check_cloud_driver

        clouds.refuse_unattended(spec.providers)  # one cloud's driver holds no keys of the other
        check_cloud_driver(spec, _cached_infra(state, spec))
    existing = state.get_run(spec.name) if spec.name else None
    if existing and existing["state"] in RESUMABLE_RUN_STATES:
        _resume(state, existing, fields, opts.runfile, opts.detach, opts.as_json)
        return
    if existing and existing["state"] in ACTIVE_RUN_STATES:
        if controller_alive(existing):
            raise UserError(f"run {existing['id']} ({spec.name}) is being driven by process {existing['controller_pid']}; "
                            f"follow it with: sdcloud watch {existing['id']}")
        run_id = existing["id"]
        note(f"picking up unfinished run {run_id} ({spec.name})")
    else:
        run_id = _new_run(state, plan, opts.yes, unattended)
    if unattended:
        return _hand_over(state, run_id, opts.as_json)
    drive(state, run_id, opts.detach, opts.as_json)


def _cached_infra(state, spec) -> dict | None:
    """The stack outputs this machine has for the run's provider and region (None: none deployed from
    here, or a provider without a cloud driver, which check_cloud_driver names first)."""
    from ..providers.traits import default_region, traits

    if traits(spec.provider).function is None:
        return None
    return state.infra(spec.provider, spec.region or "") or state.infra(
        spec.provider, spec.region or default_region(spec.provider))


def _new_run(state, plan, yes: bool, unattended: bool = False) -> str:
    """Check what can be checked before anything is paid for, make sure the stack exists, ask, and
    record the run (runs/inputs/spec.py's RunPlan: its tier and traits resolved already); its id."""
    from ..providers import get_provider
    from ..providers.traits import default_region
    from ..runs.driving.controller import new_run_id

    spec, kind, tier_obj = plan.spec, plan.traits, plan.tier
    total = spec.steps or tier_obj.job_size
    _check_estimates(spec, tier_obj, total)
    clouds.check_credentials(spec.providers or [spec.provider])  # every cloud the run may use, each named
    prov = get_provider(spec.provider)
    if not kind.catalog and (spec.budget is not None or spec.deadline_hours is not None):
        from ..runs.inputs.preflight import check_own_hosts

        # This machine and SSH hosts are not in the catalog: their own offers, priced by the user.
        check_own_hosts(spec, tier_obj, total, prov.offers(tier_obj, spec.market))
    # Only once the input is known good: a refused run prints its one line and nothing else.
    _warn_if_prices_old(spec.provider)
    if kind.stack is not None and not spec.store and not unattended:  # unattended: the deployed stack, checked
        from ..infra.automation import ensure_infra

        say = lambda line: click.echo(line, err=True)  # noqa: E731  (the stacks' progress, on stderr)
        outputs = ensure_infra(spec.provider, spec.region or default_region(spec.provider), on_output=say)
        state.save_infra(spec.provider, spec.region or "", outputs)
        clouds.ensure_other_stacks(state, spec.providers or [], ensure_infra, on_output=say)
    if unattended:
        from ..verbs.handover import check_cloud_driver

        infra = _cached_infra(state, spec)
        check_cloud_driver(spec, infra)
        if infra is not None:  # where the controller looks for it, as ensure_infra's outputs are kept
            state.save_infra(spec.provider, spec.region or "", infra)
    if kind.is_cloud and not yes:
        if not sys.stdin.isatty():
            raise UserError("launching paid cloud hosts needs confirmation: add --yes")
        click.confirm(f"Launch {spec.tier} on {spec.provider} ({spec.market})?", abort=True, err=True)
    run_id = new_run_id()
    state.create_run(run_id, spec.tier, spec.as_dict(), total, spec.name)
    note(f"run {run_id}: {spec.tier} on {spec.provider}, {total} steps")
    return run_id


def _hand_over(state, run_id: str, as_json: bool) -> None:
    """The run goes to the cloud driver: written to its bucket's journal, nothing started here."""
    from ..runs.driving.controller import Controller

    ctl = Controller(state, run_id)
    ctl.hand_over()
    if as_json:
        emit_json({"run": run_id, "state": state.get_run(run_id)["state"], "driver": "cloud"})
        return
    click.echo(f"run {run_id} is handed to the cloud driver, which takes it within its next invocation "
               f"(5 minutes); follow it with: sdcloud watch {run_id}; take it back with: sdcloud watch {run_id} --drive")


def _resume(state, run: dict, fields: dict, runfile, detach: bool, as_json: bool) -> None:
    """Continue a stopped or failed run under its own id; the flags given override its stored spec where safe."""
    from ..runs.inputs.spec import build_spec, load_runfile
    from ..verbs.resume import prepare_resume, resume_words

    given = dict(load_runfile(_local_path(runfile))) if runfile else {}
    given.update({k: v for k, v in fields.items() if v is not None})
    given.pop("name", None)
    checked = build_spec(None, {**run["spec"], **given}).as_dict()  # validated and normalised as a new run would be
    changed = prepare_resume(state, run, {k: checked[k] for k in given if k in checked})
    note(resume_words(run, changed))  # the step of the newest complete checkpoint: where the host resumes
    drive(state, run["id"], detach, as_json)


@click.command()
@output_options
@click.argument("run", metavar="RUN", shell_complete=complete_runs)
@click.option("--budget", type=USD, metavar="USD", help="A new budget for the whole run (what was spent counts).")
@click.option("--deadline", metavar="DURATION", help="A new deadline, counted from the run's start.")
@click.option("--max-price", type=USD_PER_HOUR, metavar="USD", help="A new highest spot price per hour.")
@market_options
@click.option("--steps", metavar="N", help="A new total number of steps (not below those done).")
@click.option("--detach", is_flag=True, help="Run the controller in the background; follow with sdcloud watch RUN.")
@click.option("--json", "as_json", is_flag=True, help="Print the final summary as JSON.")
def resume(run: str, budget: float | None, deadline: str | None, max_price: float | None, spot: bool | None,
           on_demand: bool | None, steps: str | None, detach: bool, as_json: bool) -> None:
    """Continue a stopped or failed run from its durable checkpoint, under its own run id."""
    from ..offers.kinds import RunKind
    from ..runs.records.state import ACTIVE_RUN_STATES, run_kind

    state = state_store()
    found = find_run(state, run)
    if run_kind(found) is RunKind.BATCH:
        return _resume_batch(state, found, detach)
    found = _refresh(state, found)
    if found["state"] == RunState.SUCCEEDED:
        raise UserError(f"run {found['id']} has already succeeded; start a new one with sdcloud up")
    fields = {"budget": budget, "deadline_hours": deadline, "max_price": max_price,
              "market": market_of(spot, on_demand), "steps": steps}
    if found["state"] in ACTIVE_RUN_STATES:
        from ..runs.driving.background import controller_alive

        if controller_alive(found):
            raise UserError(f"run {found['id']} is running; follow it with: sdcloud watch {found['id']}")
        note(f"picking up unfinished run {found['id']}")
        drive(state, found["id"], detach, as_json)
        return
    _resume(state, found, fields, None, detach, as_json)


def _refresh(state, run: dict) -> dict:
    """The run as its own bucket has it (another machine, its daemon or the cloud function may have
    driven it since this machine last looked); this machine's copy when the bucket cannot be read."""
    from ..runs.records.store import StoreError
    from ..runs.records.store_of import refresh, store_of

    store = store_of(run)  # a bucket this machine has no keys for: one line, exit 2 (nothing resumes without it)
    try:
        refresh(state, store, run["id"])
    except (UserError, StoreError, OSError) as exc:
        note(f"could not read run {run['id']}'s journal in its bucket ({str(exc).splitlines()[0][:200]}); "
             "going by this machine's copy")
    return state.get_run(run["id"])


def _resume_batch(state, job: dict, detach: bool) -> None:
    """A batch job whose driver is gone gets one again; an ended job (cancel is final) is refused."""
    from ..batch import jobs
    from ..runs.driving.background import controller_alive
    from ..runs.records.state import ACTIVE_RUN_STATES

    if job["state"] not in ACTIVE_RUN_STATES:
        raise UserError(f"batch job {job['id']} is {job['state']}: it does not run again; "
                        f"submit a new one with: sdcloud batch submit")
    if controller_alive(job):
        raise UserError(f"batch job {job['id']} is running; follow it with: sdcloud batch watch {job['id']}")
    if detach:
        pid = jobs.detach(job["id"])
        note(f"batch job {job['id']}: driver started in the background (pid {pid})")
        return
    note(f"driving batch job {job['id']} again")
    res = jobs.run_job(job["id"])
    click.echo(f"{res['job']} {state.get_run(job['id'])['state']}: {res['images_done']}/{res['images']} images")
