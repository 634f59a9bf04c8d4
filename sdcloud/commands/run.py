"""`sdcloud up`, `status`, `logs`, `down`, `watch`, `ssh`: the run lifecycle commands."""

from __future__ import annotations

import os
import signal
import sys
import time

import click

from ..errors import UserError
from ..render import emit_json, note, table


def _state():
    from ..runs.state import StateStore

    return StateStore()


def _find_run(state, run: str) -> dict:
    found = state.get_run(run)
    if found is None:
        raise UserError(f"no run {run!r}; see: sdcloud status")
    return found


class ProgressView:
    """Shows a run as it goes: a rich progress bar on a terminal, one line per event otherwise."""

    def __init__(self, total: int, quiet: bool):
        self.quiet = quiet
        self.total = total
        self.progress = None
        self.task = None
        if not quiet and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn("[bold]{task.fields[phase]:<10}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                                     TextColumn("cost ${task.fields[cost]:.4f}"), console=Console(stderr=True))
            self.task = self.progress.add_task("run", total=total, phase="starting", rate="", cost=0.0)
            self.progress.start()

    def __call__(self, kind: str, data: dict) -> None:
        if kind == "progress":
            if self.progress is not None:
                rate = f"{data['it_per_s']:.2f} it/s" if data.get("it_per_s") else ""
                self.progress.update(self.task, completed=data.get("step") or 0, phase=data.get("phase") or "",
                                     rate=rate, cost=data.get("cost") or 0.0)
            return
        detail = " ".join(f"{k}={v}" for k, v in data.items() if v is not None)
        line = f"[{time.strftime('%H:%M:%S')}] {kind} {detail}"
        if self.progress is not None:
            self.progress.console.print(line)
        elif not self.quiet or kind not in ("progress",):
            note(line)

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
        cheapest = ranked[0]
        if spec.budget < cheapest.est_cost:
            raise UserError(f"budget ${spec.budget:g} is below the cheapest estimate, ${cheapest.est_cost:.2f} "
                            f"on {cheapest.offer.row.instance_type} ({cheapest.offer.market})")


def render_summary(summ: dict) -> None:
    table(f"run {summ['run']} ({summ['tier']}): {summ['state']}" + (f" ({summ['reason']})" if summ.get("reason") else ""),
          ["#", "provider", "region", "zone", "type", "market", "$/h", "hours", "cost $", "ended by"],
          [(a["n"], a["provider"], a["region"], a["zone"], a["instance_type"], a["market"],
            f"{a['price']:.4f}" if a["price"] is not None else "", f"{a['hours']:.3f}", f"{a['cost']:.4f}", a["end_reason"] or "running")
           for a in summ["attempts"]])
    c = summ["cost"]
    line = f"step {summ['step']}/{summ['total_steps']}; total ${c['total']:.4f}"
    if c.get("savings_pct") is not None:
        line += f"; on-demand would have cost ${c['ondemand_equivalent']:.4f} (saved {c['savings_pct']:.1f}%)"
    click.echo(line)
    best = summ.get("best_cloud_offer")
    if best:
        click.echo(f"the best cloud offer for this tier and job: {best['provider']} {best['region']} {best['instance_type']} "
                   f"{best['market']} at ${best['price_per_hour_usd']:.4f}/h, about {best['est_hours']:.2f} h, ${best['est_cost']:.4f}")


@click.command()
@click.option("--tier", help="Workload tier (sdcloud tiers).")
@click.option("--spot", "market", flag_value="spot", default=None, help="Spot capacity, with on-demand to meet a deadline (default).")
@click.option("--on-demand", "market", flag_value="on-demand", help="On-demand only.")
@click.option("--max-price", help="Highest spot price per hour, USD.")
@click.option("--provider", help="aws, tencent, local (default) or ssh.")
@click.option("--region", help="Region to run in (default: any).")
@click.option("--deadline", help="Finish within this long, e.g. 36h, 1d12h, 90m.")
@click.option("--budget", help="Stop before spending more than this many USD (checkpoint kept).")
@click.option("--name", help="A name for the run; an unfinished run of that name is picked up again.")
@click.option("--dataset", help="Images (and captions): a local folder or s3:// / cos:// URL.")
@click.option("--trainer", help="builtin (default), diffusers, kohya or command.")
@click.option("--model", help="Base model: a hub id, a .safetensors file, a diffusers folder or a bucket URL "
              "(default: the tier's base model; tiny on the local provider).")
@click.option("--trainer-arg", "trainer_arg", multiple=True, metavar="KEY=VALUE",
              help="A flag for the trainer (repeatable), e.g. --trainer-arg instance_prompt='a photo of sks dog'.")
@click.option("--steps", help="Training steps (default: the tier's reference job).")
@click.option("--checkpoint-every", help="Save a checkpoint every N steps.")
@click.option("--store", help="Bucket URL for checkpoints instead of the stack's (s3://BUCKET/PREFIX or file:///DIR).")
@click.option("--simulate-preemption", help="Local provider: announce a reclaim this many seconds into the first attempt.")
@click.option("-f", "--file", "runfile", help="Run file (YAML or TOML) with the same fields; flags override it.")
@click.option("--detach", is_flag=True, help="Run the controller in the background; follow with sdcloud watch RUN.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation before launching paid hosts.")
@click.option("--json", "as_json", is_flag=True, help="Print the final summary as JSON.")
def up(tier, market, max_price, provider, region, deadline, budget, name, dataset, trainer, model, trainer_arg, steps,
       checkpoint_every, store, simulate_preemption, runfile, detach, yes, as_json) -> None:
    """Run a training job: pick the offer, launch, survive reclaims, report the cost."""
    from ..runs.controller import ACTIVE_RUN_STATES, Controller, controller_alive, detach as detach_run, new_run_id, summary
    from ..runs.spec import build_spec
    from ..offers.tiers import get_tier

    spec = build_spec(runfile, {"tier": tier, "market": market, "max_price": max_price, "provider": provider, "region": region,
                                "deadline_hours": deadline, "budget": budget, "name": name, "dataset": dataset, "trainer": trainer,
                                "model": model, "steps": steps, "checkpoint_every": checkpoint_every, "store": store,
                                "simulate_preemption": simulate_preemption, "trainer_arg": list(trainer_arg) or None})
    state = _state()
    existing = state.get_run(spec.name) if spec.name else None
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
    try:
        try:
            summ = ctl.run()
        except KeyboardInterrupt:
            # Ctrl-C stops the run cleanly: the host saves, is terminated; pick it up later by name.
            ctl.request_stop("interrupted")
            ctl._finish_stop("interrupted (Ctrl-C); checkpoint kept")
            summ = summary(state, run_id)
    finally:
        signal.signal(signal.SIGTERM, previous)
        view.close()
        close = getattr(ctl.provider, "close", None)
        if close:
            close()
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
    if summ["state"] != "succeeded":
        raise SystemExit(1)


def _default_region(provider: str) -> str:
    return {"aws": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"), "tencent": "ap-guangzhou"}.get(provider, "")


@click.command()
@click.argument("run", required=False)
@click.option("--json", "as_json", is_flag=True)
def status(run: str | None, as_json: bool) -> None:
    """Show runs, or one run's state, step and attempts."""
    from ..runs.controller import summary

    state = _state()
    if run:
        summ = summary(state, _find_run(state, run)["id"])
        if as_json:
            emit_json(summ)
        else:
            render_summary(summ)
        return
    runs = [summary(state, r["id"]) for r in state.list_runs()]
    if as_json:
        emit_json(runs)
        return
    table("runs", ["run", "name", "tier", "provider", "state", "step", "attempts", "cost $"],
          [(r["run"], r["name"] or "", r["tier"], r["provider"], r["state"], f"{r['step']}/{r['total_steps']}",
            len(r["attempts"]), f"{r['cost']['total']:.4f}") for r in runs])


def _store_for(run: dict):
    from ..runs.controller import store_url
    from ..runs.spec import RunSpec
    from ..runs.store import open_run_store

    spec = RunSpec(**run["spec"])
    state = _state()
    return open_run_store(store_url(spec, state.infra(spec.provider, spec.region or "")))


def _log_lines(run: dict, offsets: dict) -> list[str]:
    """New lines of the run's events and of each attempt's host log since `offsets`."""
    from ..runs.store import StoreError

    state = _state()
    lines = []
    for ev in state.events(run["id"], after_id=offsets.get("events", 0)):
        offsets["events"] = ev["id"]
        detail = " ".join(f"{k}={v}" for k, v in ev["data"].items())
        lines.append(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ev['time']))} controller {ev['kind']} {detail}")
    try:
        store = _store_for(run)
        for info in store.list(f"runs/{run['id']}/logs/"):
            data = store.get(info.key)
            seen = offsets.get(info.key, 0)
            if len(data) > seen:
                name = info.key.rsplit("/", 1)[-1]
                lines += [f"{name}: {line}" for line in data[seen:].decode(errors="replace").splitlines()]
                offsets[info.key] = len(data)
    except (StoreError, OSError, ValueError):
        pass
    return lines


@click.command()
@click.argument("run")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the run ends.")
def logs(run: str, follow: bool) -> None:
    """Print (or follow) a run's log: controller events and the hosts' logs from the bucket."""
    from ..runs.state import FINAL_RUN_STATES

    state = _state()
    found = _find_run(state, run)
    offsets: dict = {}
    while True:
        for line in _log_lines(found, offsets):
            click.echo(line)
        if not follow or state.get_run(found["id"])["state"] in FINAL_RUN_STATES:
            if follow:
                for line in _log_lines(found, offsets):
                    click.echo(line)
            return
        time.sleep(2)


@click.command()
@click.argument("run", required=False)
@click.option("--all", "all_runs", is_flag=True, help="Every unfinished run.")
@click.option("--json", "as_json", is_flag=True)
def down(run: str | None, all_runs: bool, as_json: bool) -> None:
    """Stop a run (or all runs): the host saves a checkpoint and every instance is terminated."""
    from ..runs.controller import ACTIVE_RUN_STATES, Controller, controller_alive

    if not run and not all_runs:
        raise UserError("name a run or pass --all; see: sdcloud status")
    state = _state()
    runs = state.list_runs(ACTIVE_RUN_STATES) if all_runs else [_find_run(state, run)]
    done = []
    for r in runs:
        if controller_alive(r):
            os.kill(r["controller_pid"], signal.SIGTERM)
            deadline = time.time() + 120
            while time.time() < deadline and state.get_run(r["id"])["state"] in ACTIVE_RUN_STATES:
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
@click.argument("run")
def watch(run: str) -> None:
    """Follow a run's progress until it ends."""
    from ..runs.controller import summary
    from ..runs.state import FINAL_RUN_STATES

    state = _state()
    found = _find_run(state, run)
    view = ProgressView(found["total_steps"], quiet=False)
    offsets: dict = {}
    try:
        while True:
            r = state.get_run(found["id"])
            for ev in state.events(found["id"], after_id=offsets.get("events", 0)):
                offsets["events"] = ev["id"]
                view(ev["kind"], ev["data"])
            view("progress", {"step": r["step"], "phase": r["state"], "cost": summary(state, r["id"])["cost"]["total"]})
            if r["state"] in FINAL_RUN_STATES:
                break
            time.sleep(2)
    finally:
        view.close()
    render_summary(summary(state, found["id"]))


@click.command()
@click.argument("run")
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
