"""`sdcloud up`, `status`, `logs`, `down`, `watch`, `ssh`: the run lifecycle commands."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import click

from .. import render
from ..errors import UserError
from ..render import echo, emit_json, note, output_options, table, wide_option
from .common import complete_providers, complete_regions, complete_runs, complete_tiers, market_of, market_options

# Exit codes (docs/runs.md): 0 the run succeeded, 1 it stopped or failed, 2 bad input (nothing
# launched), 4 no controller is driving an unfinished run, 130 interrupted by Ctrl-C.
EXIT_NOT_SUCCEEDED = 1
EXIT_NO_CONTROLLER = 4
EXIT_INTERRUPTED = 130
# When output is not a terminal (a CI log), one progress line this often.
PIPE_PROGRESS_SECONDS = 60.0


def _state():
    from ..runs.state import StateStore

    return StateStore()


def _find_run(state, run: str) -> dict:
    found = state.get_run(run)
    if found is None:
        raise UserError(f"no run {run!r}; see: sdcloud status")
    return found


def plain(kind: str, data: dict) -> str | None:
    """An event told in plain words, or None for events only -v shows."""
    from ..runs import health_view

    if kind in health_view.KINDS:
        return health_view.plain(kind, data)
    n = data.get("attempt")
    where = " ".join(str(x) for x in (data.get("instance_type"), data.get("zone") and f"in {data['zone']}") if x)
    if kind == "launching":
        parts = str(data.get("offer") or "").split("/")
        what = f"{parts[3]} in {parts[2] if parts[2] not in ('', '*') else parts[1]}" if len(parts) >= 4 else data.get("offer")
        return f"attempt {n}: launching {what} ({data.get('market')}, ${data.get('price_usd')}/h)"
    if kind == "launched":
        return f"attempt {n}: host {data.get('instance')} is up" + (" (adopted: it was already running)" if data.get("adopted") else "")
    if kind == "launch-failed":
        return f"attempt {n}: could not launch ({data.get('error')}); trying the next offer"
    if kind == "reclaimed":
        step = data.get("step")
        saved = "the host saved its checkpoint" if data.get("phase") == "preempted" else "the host is gone"
        return f"spot reclaim of attempt {n}" + (f" at step {step}" if step is not None else "") + f": {saved}"
    if kind == "host-failed":
        why = data.get("cause") or data.get("state") or "failed"
        return f"attempt {n}: host {data.get('instance')} failed ({why}), not a reclaim" + (
            f": {data['reason']}" if data.get("reason") else "")
    if kind == "store-unreachable":
        return (f"the run's store cannot be reached ({data.get('error')}); trying again every "
                f"{data.get('retry_s')} s" + (f" ({data['for_s']} s so far)" if data.get("for_s") else ""))
    if kind == "store-reachable":
        return f"the run's store answers again (after {data.get('after_s')} s)"
    if kind == "host-lost":
        return f"attempt {n}: host {data.get('instance')} lost" + (
            f" (no heartbeat for {data['heartbeat_age_s']} s)" if data.get("heartbeat_age_s") else "")
    if kind == "resumed":
        lost = data.get("lost_steps") or 0
        return (f"attempt {n}{' on ' + where if where else ''} resumed from step {data.get('from_step')}, "
                f"{lost} step{'s' if lost != 1 else ''} lost")
    if kind == "deadline-fallback":
        return f"the deadline is at risk: moving from spot to on-demand ({data.get('to')})"
    if kind == "budget":
        return f"budget ${data.get('budget')} reached (${data.get('spent')} spent): stopping with the checkpoint kept"
    if kind == "dataset-uploaded":
        return f"dataset: {data.get('files')} files in the run's bucket ({data.get('sent')} sent, {data.get('mb')} MB)"
    if kind == "model-uploaded":
        if data.get("cached"):
            return f"model: already in the run's bucket ({data.get('key')}, {data.get('mb')} MB), nothing sent"
        return f"model: {data.get('files')} file(s), {data.get('mb')} MB sent to the run's bucket in {data.get('seconds')} s"
    if kind == "resume":
        return f"resuming a {data.get('from_state')} run from step {data.get('step')} (${data.get('spent_usd')} already spent)"
    if kind.startswith("run-"):
        reason = data.get("reason")
        return f"run {kind[4:]}" + (f": {reason}" if reason else "")
    if kind in ("strays", "terminate-failed", "sweep-failed", "price-history-failed", "store-credentials-failed"):
        return f"{kind}: " + " ".join(f"{k}={v}" for k, v in data.items() if v is not None)
    return None


class ProgressView:
    """Shows a run as it goes: a rich progress bar on a terminal; otherwise one line per event and a
    progress line a minute, so that a CI log is never silent for hours. Events carry their own time."""

    def __init__(self, total: int, quiet: bool, clock=time.time):
        self.quiet = quiet or render.VERBOSITY < 0
        self.total = total
        self.clock = clock
        self.progress = None
        self.task = None
        self._last_line = 0.0
        if not self.quiet and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn("[bold]{task.fields[phase]:<10}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                                     TextColumn("cost ${task.fields[cost]:.4f}"), console=Console(stderr=True))
            self.task = self.progress.add_task("run", total=total, phase="starting", rate="", cost=0.0)
            self.progress.start()

    def _print(self, line: str) -> None:
        if self.progress is not None:
            self.progress.console.print(line, markup=False, highlight=False)
        else:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def __call__(self, kind: str, data: dict, at: float | None = None) -> None:
        if self.quiet:
            return
        if kind == "progress":
            rate = f"{data['it_per_s']:.2f} it/s" if data.get("it_per_s") else ""
            if self.progress is not None:
                self.progress.update(self.task, completed=data.get("step") or 0, phase=data.get("phase") or "",
                                     rate=rate, cost=data.get("cost") or 0.0)
            elif self.clock() - self._last_line >= PIPE_PROGRESS_SECONDS:
                self._last_line = self.clock()
                eta = ""
                if data.get("it_per_s") and data.get("step") is not None:
                    left = max(0, (data.get("total") or self.total) - data["step"]) / data["it_per_s"]
                    eta = f", about {left / 60:.0f} min left"
                self._print(f"[{time.strftime('%H:%M:%S', time.localtime(self.clock()))}] {data.get('phase') or ''} "
                            f"step {data.get('step')}/{data.get('total') or self.total}"
                            f"{', ' + rate if rate else ''}{eta}, ${data.get('cost') or 0:.4f} so far")
            return
        stamp = time.strftime("%H:%M:%S", time.localtime(at if at is not None else self.clock()))
        text = plain(kind, data)
        if render.VERBOSITY > 0 or text is None:
            detail = " ".join(f"{k}={v}" for k, v in data.items() if v is not None)
            if render.VERBOSITY > 0:
                self._print(f"[{stamp}] {kind} {detail}")
            return
        self._print(f"[{stamp}] {text}")

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def _check_estimates(spec, tier, total_steps: int) -> None:
    """Refuse a deadline or budget that no offer can meet, before anything is launched."""
    if spec.provider not in ("aws", "tencent") or (spec.deadline_hours is None and spec.budget is None):
        return
    from ..offers.catalog import load_catalog
    from ..offers.optimizer import rank

    market = None if spec.market == "spot" else "on-demand"
    from ..runs.training import gpus_used

    ranked = rank(tier, load_catalog([spec.provider]), market=market, max_price=spec.max_price, provider=spec.provider,
                  region=spec.region, job_size=total_steps, gpus_used=gpus_used(spec))
    if not ranked:
        raise UserError(f"no {spec.provider} offer fits tier {tier.name}")
    if spec.deadline_hours is not None:
        fastest = min(ranked, key=lambda e: e.est_hours)
        if spec.deadline_hours < fastest.est_hours:
            raise UserError(f"deadline {spec.deadline_hours:g} h is shorter than the fastest estimate, {fastest.est_hours:.2f} h "
                            f"on {fastest.offer.row.instance_type} ({fastest.offer.market})")
    if spec.budget is not None:
        from ..costs.budget import predict

        # The whole job: expected reclaims, the disk, and the on-demand fallback a deadline may force.
        predicted, what = predict(ranked, spec.market, spec.deadline_hours)
        if spec.budget < predicted:
            raise UserError(f"budget ${spec.budget:g} is below the predicted cost of the whole job, ${predicted:.2f} on {what}")


def _warn_if_prices_old(provider: str) -> None:
    """One stderr line when the catalog that picks the offer is older than [catalog] max_age_days."""
    if provider in ("aws", "tencent"):
        from ..offers.catalog import load_catalog, stale_warning

        warning = stale_warning(load_catalog([provider]).sources)
        if warning:
            note(warning, wrap=True)


def render_summary(summ: dict) -> None:
    what = "batch job" if summ.get("kind") == "batch" else "run"
    title = f"{what} {summ['run']} ({summ['tier']}): {summ['state']}" + (f" ({summ['reason']})" if summ.get("reason") else "")
    if not summ["attempts"]:  # nothing launched (yet): no empty table
        echo(title)
    else:
        table(title, ["#", "provider", "region", "zone", "type", "market", "$/h", "hours", "cost $", "ended by"],
              [(a["n"], a["provider"], a["region"], a["zone"], a["instance_type"], a["market"],
                f"{a['price']:.4f}" if a["price"] is not None else "", f"{a['hours']:.3f}", f"{a['cost']:.4f}",
                a["end_reason"] or "running")
               for a in summ["attempts"]], drop=["provider", "region", "hours", "#"])
    c = summ["cost"]
    done = "images" if summ.get("kind") == "batch" else "step"
    line = f"{done} {summ['step']}/{summ['total_steps']}; total ${c['total']:.4f}"
    if c.get("savings_pct") is not None:
        line += f"; on-demand would have cost ${c['ondemand_equivalent']:.4f} (saved {c['savings_pct']:.1f}%)"
    echo(line)
    if summ.get("health"):
        from ..runs.health_view import line as health_line

        echo(health_line(summ["health"]))
    best = summ.get("best_cloud_offer")
    if best:
        echo(f"the best cloud offer for this tier and job: {best['provider']} {best['region']} {best['instance_type']} "
             f"{best['market']} at ${best['price_per_hour_usd']:.4f}/h, about {best['est_hours']:.2f} h, ${best['est_cost']:.4f}")


def _budget(value: str | None) -> str | None:
    """--budget as given; `$20` is read as 20, and a 0 that the shell made from `$20` gets a hint."""
    if value is None:
        return None
    text = str(value).strip().lstrip("$")
    try:
        if float(text) == 0:
            raise UserError("--budget 0 cannot buy anything: if you typed --budget $20, the shell ate the '$20'; "
                            "write --budget 20 (USD) or quote it: --budget '$20'")
    except ValueError:
        pass
    return text


def _local_path(value: str | None) -> str | None:
    """A local path made absolute against the directory the user is in (a URL or a model id is left alone)."""
    if not value or "://" in value:
        return value
    path = Path(value).expanduser()
    return str(path.resolve()) if path.exists() else value


def _run_ended(ctl, state, run_id: str, as_json: bool, interrupted: bool = False) -> None:
    from ..runs.controller import summary

    summ = summary(state, run_id)
    if summ["state"] == "succeeded":
        from ..runs.artifacts import location

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
            click.echo(f"the model is in {summ['artifacts']}; download it with: sdcloud pull {run_id} [DIR]")
    if interrupted:
        raise SystemExit(EXIT_INTERRUPTED)
    if summ["state"] != "succeeded":
        raise SystemExit(EXIT_NOT_SUCCEEDED)


def drive(state, run_id: str, detach: bool, as_json: bool, take_over: bool = False) -> None:
    """Drive a run to its end here (or in the background with --detach), then report it."""
    from ..runs.controller import Controller, detach as detach_run

    if detach:
        pid = detach_run(run_id)
        if as_json:
            emit_json({"run": run_id, "controller_pid": pid, "state": "running"})
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
            ctl._finish_stop("interrupted (Ctrl-C); checkpoint kept")
            ctl.sweep_strays()
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        ctl.lease.release()  # after a Ctrl-C too: the next driver need not wait for the lease to lapse
        view.close()
        close = getattr(ctl.provider, "close", None)
        if close:
            close()
    _run_ended(ctl, state, run_id, as_json, interrupted)


@click.command()
@output_options
@click.option("--tier", metavar="TIER", shell_complete=complete_tiers, help="Workload tier (sdcloud tiers).")
@market_options
@click.option("--max-price", metavar="USD", help="Highest spot price per hour, USD.")
@click.option("--provider", metavar="PROVIDER", shell_complete=complete_providers, help="aws, tencent, local (default) or ssh.")
@click.option("--region", metavar="REGION", shell_complete=complete_regions, help="Region to run in (default: any).")
@click.option("--deadline", metavar="DURATION", help="Finish within this long, e.g. 36h, 1d12h, 90m.")
@click.option("--budget", metavar="USD", help="Stop before spending more than this many USD (checkpoint kept).")
@click.option("--name", metavar="NAME", shell_complete=complete_runs,
              help="A name for the run; an unfinished, stopped or failed run of that name is continued.")
@click.option("--dataset", metavar="PATH", help="Images (and captions): a local folder or s3:// / cos:// URL.")
@click.option("--trainer", metavar="TRAINER", help="builtin (default), diffusers, kohya or command.")
@click.option("--model", metavar="MODEL", help="Base model: a hub id, a .safetensors file, a diffusers folder or a bucket URL "
              "(default: the tier's base model; tiny on the local provider).")
@click.option("--trainer-arg", "trainer_arg", multiple=True, metavar="KEY=VALUE",
              help="A flag for the trainer (repeatable), e.g. --trainer-arg instance_prompt='a photo of sks dog'.")
@click.option("--steps", metavar="N", help="Training steps (default: the tier's reference job).")
@click.option("--checkpoint-every", metavar="N", help="Save a checkpoint every N steps.")
@click.option("--store", metavar="URL", help="Bucket URL for checkpoints instead of the stack's (s3://BUCKET/PREFIX or file:///DIR).")
@click.option("--simulate-preemption", metavar="SECONDS", help="Local provider: announce a reclaim this many seconds into the first attempt.")
@click.option("--self-end-grace", metavar="DURATION",
              help="How long a finished host waits for this controller before it ends itself (default 10m; 0: at once).")
@click.option("-f", "--file", "runfile", metavar="PATH", help="Run file (YAML or TOML) with the same fields; flags override it.")
@click.option("--detach", is_flag=True, help="Run the controller in the background; follow with sdcloud watch RUN.")
@click.option("--unattended", is_flag=True, default=None,
              help="Hand the run to the cloud driver at once (sdcloud infra up deploys it): nothing runs here.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation before launching paid hosts.")
@click.option("--json", "as_json", is_flag=True, help="Print the final summary as JSON.")
def up(tier, spot, on_demand, max_price, provider, region, deadline, budget, name, dataset, trainer, model, trainer_arg, steps,
       checkpoint_every, store, simulate_preemption, self_end_grace, runfile, detach, unattended, yes, as_json) -> None:
    """Run a training job: pick the offer, launch, survive reclaims, report the cost."""
    from .. import config
    from ..offers.tiers import get_tier
    from ..runs.controller import ACTIVE_RUN_STATES, controller_alive, new_run_id

    flags = {"tier": tier, "market": market_of(spot, on_demand), "max_price": max_price, "provider": provider,
             "region": region, "deadline_hours": deadline, "budget": _budget(budget), "name": name,
             "dataset": _local_path(dataset), "trainer": trainer, "model": _local_path(model), "steps": steps,
             "checkpoint_every": checkpoint_every, "store": store, "simulate_preemption": simulate_preemption,
             "self_end_grace": self_end_grace, "trainer_arg": list(trainer_arg) or None}
    state = _state()
    existing = state.get_run(name) if name else None
    if existing and existing["state"] in ("stopped", "failed"):
        _resume(state, existing, flags, runfile, detach, as_json)
        return
    from ..runs.spec import build_spec, load_runfile

    in_file = set(load_runfile(_local_path(runfile))) if runfile else set()
    defaults = config.defaults()
    if unattended is None:
        unattended = defaults.pop("unattended", "false").lower() in ("1", "true", "yes")
    defaults.pop("unattended", None)
    if unattended and detach:
        raise UserError("--unattended and --detach both say who drives the run: choose one")
    for key, value in defaults.items():  # [defaults] in config.toml: below the run file and the flags
        if flags.get(key) is None and key not in in_file:
            flags[key] = value
    spec = build_spec(_local_path(runfile), flags)
    existing = state.get_run(spec.name) if spec.name else None
    if existing and existing["state"] in ("stopped", "failed"):
        _resume(state, existing, flags, runfile, detach, as_json)
        return
    if existing and existing["state"] in ACTIVE_RUN_STATES:
        if controller_alive(existing):
            raise UserError(f"run {existing['id']} ({spec.name}) is being driven by process {existing['controller_pid']}; "
                            f"follow it with: sdcloud watch {existing['id']}")
        run_id = existing["id"]
        note(f"picking up unfinished run {run_id} ({spec.name})")
    else:
        tier_obj = get_tier(spec.tier)
        total = spec.steps or tier_obj.job_size
        _check_estimates(spec, tier_obj, total)
        from ..providers import get_provider

        prov = get_provider(spec.provider)
        check = getattr(prov, "check_credentials", None)
        if check:
            check()
        if spec.provider not in ("aws", "tencent") and (spec.budget is not None or spec.deadline_hours is not None):
            from ..runs.preflight import check_own_hosts

            # This machine and SSH hosts are not in the catalog: their own offers, priced by the user.
            check_own_hosts(spec, tier_obj, total, prov.offers(tier_obj, spec.market))
        # Only once the input is known good: a refused run prints its one line and nothing else.
        _warn_if_prices_old(spec.provider)
        if spec.provider in ("aws", "tencent") and not spec.store:
            from ..infra.automation import ensure_infra

            outputs = ensure_infra(spec.provider, spec.region or _default_region(spec.provider),
                                   on_output=lambda line: click.echo(line, err=True))
            state.save_infra(spec.provider, spec.region or "", outputs)
        if spec.provider in ("aws", "tencent") and not yes:
            if not sys.stdin.isatty():
                raise UserError("launching paid cloud hosts needs confirmation: add --yes")
            click.confirm(f"Launch {spec.tier} on {spec.provider} ({spec.market})?", abort=True, err=True)
        run_id = new_run_id()
        state.create_run(run_id, spec.tier, spec.as_dict(), total, spec.name)
        note(f"run {run_id}: {spec.tier} on {spec.provider}, {total} steps")
    if unattended:
        return _hand_over(state, run_id, as_json)
    drive(state, run_id, detach, as_json)


def _hand_over(state, run_id: str, as_json: bool) -> None:
    """The run goes to the cloud driver: written to its bucket's journal, nothing started here."""
    from ..runs.controller import Controller

    ctl = Controller(state, run_id)
    ctl.hand_over()
    if as_json:
        emit_json({"run": run_id, "state": state.get_run(run_id)["state"], "driver": "cloud"})
        return
    click.echo(f"run {run_id} is handed to the cloud driver, which takes it within its next invocation "
               f"(5 minutes); follow it with: sdcloud watch {run_id}; take it back with: sdcloud watch {run_id} --drive")


def _resume(state, run: dict, flags: dict, runfile, detach: bool, as_json: bool) -> None:
    """Continue a stopped or failed run under its own id; the flags given override its stored spec where safe."""
    from ..runs.controller import prepare_resume
    from ..runs.spec import build_spec, load_runfile

    given = dict(load_runfile(_local_path(runfile))) if runfile else {}
    given.update({k: v for k, v in flags.items() if v is not None})
    given.pop("name", None)
    checked = build_spec(None, {**run["spec"], **given}).as_dict()  # validated and normalised as a new run would be
    changed = prepare_resume(state, run, {k: checked[k] for k in given if k in checked})
    note(f"resuming run {run['id']}" + (f" ({run['name']})" if run.get("name") else "") + f" from step {run['step']}"
         + (f" with new {', '.join(changed)}" if changed else ""))
    drive(state, run["id"], detach, as_json)


@click.command()
@output_options
@click.argument("run", metavar="RUN", shell_complete=complete_runs)
@click.option("--budget", metavar="USD", help="A new budget for the whole run (what was spent counts).")
@click.option("--deadline", metavar="DURATION", help="A new deadline, counted from the run's start.")
@click.option("--max-price", metavar="USD", help="A new highest spot price per hour.")
@market_options
@click.option("--steps", metavar="N", help="A new total number of steps (not below those done).")
@click.option("--detach", is_flag=True, help="Run the controller in the background; follow with sdcloud watch RUN.")
@click.option("--json", "as_json", is_flag=True, help="Print the final summary as JSON.")
def resume(run, budget, deadline, max_price, spot, on_demand, steps, detach, as_json) -> None:
    """Continue a stopped or failed run from its durable checkpoint, under its own run id."""
    from ..runs.controller import ACTIVE_RUN_STATES

    from ..runs.state import BATCH, run_kind

    state = _state()
    found = _find_run(state, run)
    if run_kind(found) == BATCH:
        return _resume_batch(state, found, detach)
    if found["state"] == "succeeded":
        raise UserError(f"run {found['id']} has already succeeded; start a new one with sdcloud up")
    flags = {"budget": _budget(budget), "deadline_hours": deadline, "max_price": max_price,
             "market": market_of(spot, on_demand), "steps": steps}
    if found["state"] in ACTIVE_RUN_STATES:
        from ..runs.controller import controller_alive

        if controller_alive(found):
            raise UserError(f"run {found['id']} is running; follow it with: sdcloud watch {found['id']}")
        note(f"picking up unfinished run {found['id']}")
        drive(state, found["id"], detach, as_json)
        return
    _resume(state, found, flags, None, detach, as_json)


def _resume_batch(state, job: dict, detach: bool) -> None:
    """A batch job whose driver is gone gets one again; an ended job (cancel is final) is refused."""
    from ..batch import jobs
    from ..runs.controller import ACTIVE_RUN_STATES, controller_alive

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


def _default_region(provider: str) -> str:
    return {"aws": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"), "tencent": "ap-guangzhou"}.get(provider, "")


def controller_note(run: dict) -> str | None:
    """For an unfinished run that no live controller drives: what to do about it (hosts may be billing)."""
    from ..runs.controller import ACTIVE_RUN_STATES, controller_alive

    from ..runs.state import BATCH, run_kind

    if run["state"] not in ACTIVE_RUN_STATES or controller_alive(run):
        return None
    name = run.get("name") or run["id"]
    if run_kind(run) == BATCH:
        return (f"no controller: nothing drives batch job {run['id']}, and its hosts may still be billing; "
                f"drive it again with: sdcloud resume {name}; or cancel it with: sdcloud down {name}")
    return (f"no controller: nothing is watching run {run['id']}, and its host may still be billing; "
            f"resume it with: sdcloud resume {name}; or stop it with: sdcloud down {name}")


@click.command()
@output_options
@wide_option
@click.argument("run", required=False, metavar="RUN", shell_complete=complete_runs)
@click.option("--json", "as_json", is_flag=True)
@click.option("--store", "store_url", metavar="URL",
              help="Read RUN's history from its bucket (s3://BUCKET/PREFIX, cos://..., file:///DIR): from any machine.")
def status(run: str | None, as_json: bool, store_url: str | None) -> None:
    """Show runs and batch jobs, or one's state, progress and attempts."""
    from ..runs.controller import summary
    from ..runs.state import ACTIVE_RUN_STATES

    state = _state()
    if store_url and not run:
        raise UserError("--store reads one run's history: name the run, e.g. sdcloud status RUN --store URL")
    if run and store_url:
        _restore_from_bucket(state, run, store_url)
    if run:
        found = _find_run(state, run)
        summ = summary(state, found["id"])
        dead = controller_note(found)
        summ["controller"] = "none" if dead else ("alive" if found["state"] in ACTIVE_RUN_STATES else "ended")
        host = _host_state(found)
        if host:
            summ["host"] = host
        if as_json:
            emit_json(summ)
        else:
            render_summary(summ)
            if dead:
                echo(dead)
            if host:
                echo(f"host: {host}")
        return
    runs = state.list_runs()
    summs = []
    for r in runs:
        s = summary(state, r["id"])
        s["controller"] = "none" if controller_note(r) else "ok"
        summs.append(s)
    if as_json:
        emit_json(summs)
        return
    table("runs", ["run", "name", "tier", "provider", "state", "step", "attempts", "cost $"],
          [(r["run"], r["name"] or "", r["tier"], r["provider"],
            "no controller" if r["controller"] == "none" else r["state"], f"{r['step']}/{r['total_steps']}",
            len(r["attempts"]), f"{r['cost']['total']:.4f}") for r in summs],
          drop=["attempts", "provider", "name"])
    if any(r["controller"] == "none" for r in summs):
        echo("no controller: drive a run or batch job again with: sdcloud resume RUN; "
             "or stop it with: sdcloud down RUN")


def _host_state(run: dict) -> str | None:
    """What the run's host says of itself beyond its phase: `unattended` (the controller's heartbeat
    is stale), or that it ended itself and why; None when it says neither or cannot be read."""
    import json as _json

    from ..runs.state import TRAIN, run_kind

    if run_kind(run) != TRAIN:
        return None
    try:
        doc = _json.loads(_store_for(run).get(f"runs/{run['id']}/status.json"))
    except Exception:  # noqa: BLE001 - no status yet, no store: nothing to add
        return None
    se = doc.get("self_end")
    if isinstance(se, dict):
        return f"ended itself ({se.get('reason')}{', unattended' if se.get('unattended') else ''})"
    return "unattended" if doc.get("unattended") else None


def _restore_from_bucket(state, run: str, url: str) -> None:
    """Rebuild RUN's rows here from the journal in its bucket (sdcloud.runs.journal); then every
    command (logs, watch, cost report, down, resume) works on this machine as on the one that started it."""
    from ..runs.journal import restore
    from ..runs.preflight import check_store_url
    from ..runs.store import open_run_store, store_config

    conf = store_config("local", check_store_url(url), None, None)
    found = state.get_run(run)
    if restore(state, open_run_store(conf), found["id"] if found else run) is None:
        raise UserError(f"no run {run!r} in {url} (its journal is runs/{run}/journal/run.json); "
                        "name the run by its id there")


def _store_for(run: dict):
    from ..runs.controller import store_url
    from ..runs.spec import RunSpec
    from ..runs.store import open_run_store

    from ..runs.state import BATCH, run_kind

    if run_kind(run) == BATCH:  # a batch job's spec holds its store's config itself
        return open_run_store(run["spec"]["store"])
    spec = RunSpec(**run["spec"])
    state = _state()
    return open_run_store(store_url(spec, state.infra(spec.provider, spec.region or "")))


_LOG_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:[.,](\d+))?")
_STEP_LINE = re.compile(r"SDCLOUD_STEP \{")
# The trainer's protocol lines (sdcloud_agent.trainers.base): for the agent, not for people.
_PROTOCOL = re.compile(r"\bSDCLOUD_(STEP|CHECKPOINT|DONE) (\{.*\})\s*$")
# A Python warning as the warnings module prints it (`file.py:12: FutureWarning: ...`, or bare
# `UserWarning: ...`), and the indented source line it prints next: library noise unless -v.
_PY_WARNING = re.compile(r"(?:^|\.py:\d+: |: )[A-Z]\w*Warning: ")
_AGENT_PREFIX = re.compile(r"^[A-Z]+ sdcloud_agent\.trainer: ")


def _parse_time(line: str) -> float | None:
    m = _LOG_TIME.match(line)
    if not m:
        return None
    try:
        stamp = time.mktime(time.strptime(m.group(1).replace("T", " "), "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None
    return stamp + (float("0." + m.group(2)) if m.group(2) else 0.0)


def log_records(run: dict, offsets: dict, steps: bool = False) -> list[dict]:
    """New records of the run's events and hosts' logs since `offsets`, each with its own time.

    Host log lines carry the agent's timestamp; a line without one (a trainer's traceback) takes the
    time of the line before it, so that a merge by time keeps it in place.
    """
    from ..runs.store import StoreError

    state = _state()
    out = []
    for ev in state.events(run["id"], after_id=offsets.get("events", 0)):
        offsets["events"] = ev["id"]
        out.append({"time": ev["time"], "source": "controller", "attempt": ev["data"].get("attempt"),
                    "kind": ev["kind"], "text": plain(ev["kind"], ev["data"]) or ev["kind"],
                    "detail": " ".join(f"{k}={v}" for k, v in ev["data"].items())})
    try:
        for key, name, data, born in _log_sources(run):
            seen = offsets.get(key, 0)
            if len(data) <= seen:
                continue
            m = re.search(r"attempt-(\d+)", name)
            attempt = int(m.group(1)) if m else None
            last = offsets.get(key + "#t", born)
            in_warning = offsets.get(key + "#w", False)
            for line in data[seen:].decode(errors="replace").splitlines():
                at = _parse_time(line) or last
                last = at
                if not steps and _STEP_LINE.search(line):
                    continue
                kind, in_warning = _line_kind(line, in_warning)
                out.append({"time": at, "source": name.removesuffix(".log"), "attempt": attempt, "kind": kind,
                            "text": line, "detail": ""})
            offsets[key + "#w"] = in_warning
            offsets[key] = len(data)
            offsets[key + "#t"] = last
    except (StoreError, OSError, ValueError):
        pass
    out.sort(key=lambda r: r["time"])
    return out


def _log_sources(run: dict):
    """(key, name, bytes, a time for lines before the first stamped one) of every log the run has: its
    hosts' logs in the bucket, and for a batch job on this machine its pool's worker logs."""
    from .. import config
    from ..runs.state import BATCH, run_kind

    store = _store_for(run)
    for info in store.list(f"runs/{run['id']}/logs/"):
        yield info.key, info.key.rsplit("/", 1)[-1], store.get(info.key), 0.0
    if run_kind(run) == BATCH:
        folder = config.home() / "batch" / run["id"]
        for f in sorted(folder.glob("*.log")) if folder.is_dir() else []:
            yield str(f), f.name, f.read_bytes(), f.stat().st_ctime


def _line_kind(line: str, in_warning: bool) -> tuple[str, bool]:
    """A host log line's kind: "log", "warning" (a library's Python warning, with the source line
    the warnings module prints under it) or a protocol tag ("step", "checkpoint", "done"); and
    whether the next line may still belong to a warning."""
    proto = _PROTOCOL.search(line)
    if proto:
        return proto.group(1).lower(), False
    body = _AGENT_PREFIX.sub("", _LOG_TIME.sub("", line).lstrip())
    if _PY_WARNING.search(body):
        return "warning", True
    if in_warning and (body.startswith((" ", "\t")) or not body.strip()):
        return "warning", True
    return "log", False


def _protocol_words(tag: str, payload: str) -> str | None:
    """A protocol line in plain words; None when it cannot be read (then it is shown as it is)."""
    import json as _json

    try:
        doc = _json.loads(payload)
    except ValueError:
        return None
    if tag == "CHECKPOINT":
        return f"checkpoint step {doc.get('step', '?')} saved"
    if tag == "DONE":
        return "trainer finished" + (f" at step {doc['step']}" if "step" in doc else "")
    parts = [f"step {doc.get('step', '?')}"]
    if doc.get("loss") is not None:
        parts.append(f"loss {doc['loss']:.4g}" if isinstance(doc["loss"], (int, float)) else f"loss {doc['loss']}")
    if doc.get("it_per_s") is not None:
        parts.append(f"{doc['it_per_s']} it/s")
    return ", ".join(parts)


def _log_line(r: dict) -> str:
    """One line per record, with one time stamp: the record's own (a host line's is taken off its text)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["time"]))
    if r["source"] == "controller":
        text = f"{r['kind']} {r['detail']}".strip() if render.VERBOSITY > 0 else r["text"]
        return f"{stamp} controller {text}"
    text = _LOG_TIME.sub("", r["text"], count=1).lstrip() if _LOG_TIME.match(r["text"]) else r["text"]
    proto = _PROTOCOL.search(text)
    if proto and render.VERBOSITY <= 0:
        words = _protocol_words(proto.group(1), proto.group(2))
        if words is not None:
            text = text[:proto.start()] + words
    return f"{stamp} {r['source']}: {text}"


@click.command()
@output_options
@click.argument("run", metavar="RUN", shell_complete=complete_runs)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the run ends.")
@click.option("--tail", "tail_n", type=int, metavar="N", help="Only the last N lines.")
@click.option("--attempt", type=int, metavar="N", help="Only attempt N (and the controller's events about it).")
@click.option("--steps", is_flag=True, help="Include the trainer's per-step lines.")
@click.option("--json", "as_json", is_flag=True, help="One JSON record per line: time, source, attempt, kind, text.")
def logs(run: str, follow: bool, tail_n: int | None, attempt: int | None, steps: bool, as_json: bool) -> None:
    """Print (or follow) a run's log: controller events and the hosts' logs, merged in time order.

    The trainer's protocol lines read in plain words (checkpoint step 500 saved) and libraries'
    Python warnings are left out; -v shows both as the host wrote them."""
    import json as _json

    from ..runs.state import FINAL_RUN_STATES

    if tail_n is not None and tail_n < 0:
        raise UserError(f"--tail must be 0 or more, got {tail_n}")
    state = _state()
    found = _find_run(state, run)
    offsets: dict = {}

    def show(records: list[dict], first: bool) -> None:
        if attempt is not None:
            records = [r for r in records if r["attempt"] in (attempt, None) and
                       (r["attempt"] == attempt or r["source"] == "controller" and r["kind"].startswith("run-"))]
        if render.VERBOSITY <= 0:
            # Libraries' Python warnings (FutureWarning and the like) are noise to a user: -v shows them.
            records = [r for r in records if r["source"] == "controller" or r["kind"] != "warning"]
        if first and tail_n is not None:
            records = records[-tail_n:] if tail_n else []
        for r in records:
            click.echo(_json.dumps(r) if as_json else _log_line(r))

    show(log_records(found, offsets, steps), True)
    while follow and state.get_run(found["id"])["state"] not in FINAL_RUN_STATES:
        time.sleep(2)
        show(log_records(found, offsets, steps), False)
    if follow:
        show(log_records(found, offsets, steps), False)


@click.command()
@output_options
@click.argument("run", required=False, metavar="RUN", shell_complete=complete_runs)
@click.option("--all", "all_runs", is_flag=True, help="Every unfinished run.")
@click.option("--yes", is_flag=True, help="Do not ask before stopping every run (--all).")
@click.option("--json", "as_json", is_flag=True)
def down(run: str | None, all_runs: bool, yes: bool, as_json: bool) -> None:
    """Stop a run (or all runs): the host saves a checkpoint and every instance is terminated."""
    from ..runs.controller import ACTIVE_RUN_STATES, Controller, controller_alive

    if not run and not all_runs:
        raise UserError("name a run or pass --all; see: sdcloud status")
    state = _state()
    from ..runs.state import BATCH, run_kind

    runs = state.list_runs(ACTIVE_RUN_STATES) if all_runs else [_find_run(state, run)]
    if all_runs and runs and not yes:
        click.confirm(f"Stop {len(runs)} run(s): {', '.join(r['id'] for r in runs)}?", abort=True, err=True)
    done = []
    for r in runs:
        if run_kind(r) == BATCH:
            # A batch job's stop is its cancel: final, its driver exits and starts no worker or host again.
            from ..batch.jobs import end_hosts

            if r["state"] in ACTIVE_RUN_STATES:
                from ..batch.jobs import cancel as cancel_job

                cancel_job(r["id"], reason="cancelled by sdcloud down")
            end_hosts(r["id"])
            done.append({"run": r["id"], "state": state.get_run(r["id"])["state"]})
            continue
        if controller_alive(r):
            os.kill(r["controller_pid"], signal.SIGTERM)
            deadline = time.time() + 120
            # Until the controller has stopped the run, or is gone without doing so (then we finish it here).
            while (time.time() < deadline and state.get_run(r["id"])["state"] in ACTIVE_RUN_STATES
                   and controller_alive(state.get_run(r["id"]))):
                time.sleep(0.5)
        if state.get_run(r["id"])["state"] in ACTIVE_RUN_STATES:
            ctl = Controller(state, r["id"])
            ctl._finish_stop("stopped by sdcloud down")
            ctl.sweep_strays()
        done.append({"run": r["id"], "state": state.get_run(r["id"])["state"]})
    if as_json:
        emit_json(done)
    else:
        for d in done:
            click.echo(f"{d['run']}: {d['state']}")


@click.command()
@output_options
@click.argument("run", metavar="RUN", shell_complete=complete_runs)
@click.option("--interval", type=float, default=2.0, show_default=True, metavar="SECONDS", help="How often to look.")
@click.option("--drive", "take_over", is_flag=True,
              help="Take the run from whichever driver holds it (the cloud driver, another machine) and drive it here.")
def watch(run: str, interval: float, take_over: bool) -> None:
    """Follow a run's progress until it ends; exit with the run's own exit code."""
    from ..runs.controller import summary
    from ..runs.state import FINAL_RUN_STATES, TRAIN, run_kind

    state = _state()
    found = _find_run(state, run)
    if take_over:
        if run_kind(found) != TRAIN:
            raise UserError(f"{found['id']} is a batch job; --drive takes training runs")
        from ..runs.journal import restore

        restore(state, _store_for(found), found["id"])  # the bucket's history is newer than this machine's
        found = state.get_run(found["id"])
        if found["state"] in FINAL_RUN_STATES:
            raise UserError(f"run {found['id']} has ended ({found['state']}); nothing to drive")
        drive(state, found["id"], False, False, take_over=True)
        return
    view = ProgressView(found["total_steps"], quiet=False)
    offsets: dict = {}
    # A controller that was just started writes its pid at once; give it a moment before judging.
    grace_until = time.time() + 2 * interval
    try:
        while True:
            r = state.get_run(found["id"])
            for ev in state.events(found["id"], after_id=offsets.get("events", 0)):
                offsets["events"] = ev["id"]
                view(ev["kind"], ev["data"], at=ev["time"])
            summ = summary(state, r["id"])
            view("progress", {"step": r["step"], "phase": r["state"], "cost": summ["cost"]["total"],
                              "total": r["total_steps"]})
            if r["state"] in FINAL_RUN_STATES:
                break
            dead = controller_note(r)
            if dead and time.time() > grace_until:
                view.close()
                click.echo(dead, err=True)
                raise SystemExit(EXIT_NO_CONTROLLER)
            time.sleep(interval)
    except KeyboardInterrupt:
        view.close()
        name = found.get("name") or found["id"]
        click.echo(f"stopped watching; run {found['id']} continues (sdcloud watch {name} to follow it again, "
                   f"sdcloud down {name} to stop it)", err=True)
        raise SystemExit(EXIT_INTERRUPTED)
    finally:
        view.close()
    summ = summary(state, found["id"])
    render_summary(summ)
    if summ["state"] != "succeeded":
        raise SystemExit(EXIT_NOT_SUCCEEDED)


@click.command()
@output_options
@click.argument("run", metavar="RUN", shell_complete=complete_runs)
def ssh(run: str) -> None:
    """Open a shell on a run's current host."""
    from ..runs.controller import Controller

    state = _state()
    found = _find_run(state, run)
    ctl_attempts = state.attempts(found["id"])
    live = [a for a in ctl_attempts if a.state != "ended" and a.instance_id]
    if not live:
        raise UserError(f"run {found['id']} has no running host")
    a = live[-1]
    if a.provider == "local":
        from ..providers.local.provider import LocalProvider

        host_dir = LocalProvider().host_dir(a.instance_id)
        click.echo(f"the local provider's host is this machine; its working folder is {host_dir}")
        return
    ctl = Controller(state, found["id"])
    inst = next(iter(ctl.provider.describe([a.instance_id], region=a.region)), None)
    if inst is None or not inst.live:
        raise UserError(f"instance {a.instance_id} is not running")
    argv_of = getattr(ctl.provider, "ssh_argv", None)
    if argv_of is not None:
        argv = list(argv_of(inst))
    else:
        target = inst.public_ip or inst.private_ip
        if not target:
            raise UserError(f"instance {a.instance_id} has no reachable address")
        argv = ["ssh", f"{os.environ.get('SDCLOUD_SSH_USER', 'ubuntu')}@{target}"]
    os.execvp(argv[0], argv)
