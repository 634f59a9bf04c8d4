"""`sdcloud batch ...` and `sdcloud scheduler ...`: batch image generation jobs and their schedules."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import click

from ..render import echo, emit_json, note, output_options, table, wide_option
from ..runs.records.run_state import RunState
# Every batch tier, for the help texts (batch/submit.py BATCH_TIERS holds their families; a test keeps
# the two the same without importing the batch domain to render --help).
from .batch_progress import BatchProgress
from .common import BATCH_TIER_NAMES, USD, USD_PER_HOUR, ProvidersHelp


def submit_options(f):
    opts = [
        click.option("--tier", required=True, metavar="TIER", help=", ".join(BATCH_TIER_NAMES)),
        click.option("--model", required=True, metavar="MODEL", help="base model (a hub id or a local folder on the host)"),
        click.option("--lora", default=None, metavar="RUN|FILE",
                     help="a training run (its id or name, see sdcloud status) or a LoRA file"),
        click.option("--prompts", "prompts", required=True, type=click.Path(dir_okay=False), metavar="FILE",
                     help="text (one a line) or JSONL"),
        click.option("--images-per-prompt", type=int, default=1, show_default=True, metavar="N"),
        click.option("--width", type=int, default=None, metavar="PX",
                     help="image width for every prompt (a JSONL line's own wins; default: the model's, tiny 64)"),
        click.option("--height", type=int, default=None, metavar="PX", help="image height (as --width)"),
        click.option("--steps", type=int, default=None, metavar="N",
                     help="sampling steps (as --width; default 30, tiny 2)"),
        click.option("--workers", type=int, default=None, metavar="K",
                     help="K hosts working in parallel (default 1, or what --deadline needs)"),
        click.option("--spot/--on-demand", "spot", default=True, show_default=True),
        click.option("--max-price", type=USD_PER_HOUR, default=None, help="USD per hour per host"),
        click.option("--deadline", default=None, metavar="DURATION", help="e.g. 8h, 1d12h"),
        click.option("--budget", type=USD, default=None, help="USD for the whole job"),
        click.option("--provider", default="local", show_default=True, metavar="PROVIDER", cls=ProvidersHelp,
                     help="{all}; aws,tencent: workers in both, images in the first's store"),
        click.option("--name", default=None, metavar="NAME",
                     help="a name to use instead of the job id: letters, digits, '.', '_', '-' (at most 63), not an id"),
        click.option("--store", default=None, metavar="URL",
                     help="s3://BUCKET/PREFIX, cos://BUCKET-APPID/PREFIX or file:///DIR (default: the provider's run bucket)"),
        click.option("--max-failed-boots", type=int, default=None, metavar="N",
                     help="failed host boots in a row that end the job (default 3)"),
        click.option("--generator", type=click.Choice(["diffusers", "fake"]), default="diffusers", hidden=True),
        click.option("--fake-delay", type=float, default=0.0, hidden=True),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _options(kw: dict):
    from ..batch.jobs import SubmitOptions
    from ..runs.inputs.config_check import check_settings
    from ..runs.inputs.spec import parse_duration

    check_settings()  # every section of config.toml ([hosts] self_end_grace reaches the hosts), before the job exists
    if kw.get("name") is not None:  # checked as a run's name is (names.py): shown by status, never taken for an id
        from ..names import check_name

        kw["name"] = check_name(kw["name"])
    providers = None
    if "," in kw["provider"]:  # several clouds at once (docs/batch.md): the first is the home
        from ..batch.clouds import resolve

        providers = resolve(kw["provider"])
        kw["provider"] = providers[0]
        kw["providers"] = providers if len(providers) > 1 else None
    store = kw["store"]
    if store:
        from ..runs.inputs.preflight import check_store_url

        # Before the bucket is opened or a row written: ftp://... used to end in a traceback.
        store = check_store_url(store, kw["provider"])
    return SubmitOptions(
        tier=kw["tier"], model=kw["model"], prompts=str(Path(kw["prompts"]).expanduser().resolve()), lora=kw["lora"],
        images_per_prompt=kw["images_per_prompt"], workers=kw["workers"], market="spot" if kw["spot"] else "on-demand",
        max_price=kw["max_price"], deadline_hours=parse_duration(kw["deadline"]) if kw["deadline"] else None,
        budget=kw["budget"], provider=kw["provider"], name=kw["name"], store=store, generator=kw["generator"],
        fake_delay=kw["fake_delay"], max_failed_boots=kw["max_failed_boots"],
        # A schedule added before these flags existed has none of them.
        width=kw.get("width"), height=kw.get("height"), steps=kw.get("steps"), providers=kw.get("providers"))


def _ensure_bucket(kw: dict) -> None:
    """AWS and Tencent jobs without --store use the run bucket of the provider's stack, as `sdcloud up`
    does: created on first use, cached where the job's store is chosen (sdcloud.batch.jobs.store_conf)."""
    from ..providers.traits import default_region, has_stack, names

    # Across clouds, each other cloud's bucket is needed whatever --store says (the home's).
    wanted = ([] if kw["store"] else [kw["provider"]]) + list((kw.get("providers") or [])[1:])
    for name in (p for p in wanted if p in names(where=has_stack)):
        from ..infra.automation import ensure_infra
        from ..runs.records.state import StateStore

        if StateStore().infra(name, ""):
            continue  # made before: its outputs are cached here
        outputs = ensure_infra(name, default_region(name), on_output=lambda line: click.echo(line, err=True))
        StateStore().save_infra(name, "", outputs)


@click.group()
def batch() -> None:
    """Batch image generation: a prompt list over K spot workers, each image exactly once."""


@batch.command()
@output_options
@submit_options
@click.option("--detach", is_flag=True, help="return at once; the job runs in the background")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the job id and what was submitted.")
def submit(detach: bool, as_json: bool, **kw) -> None:
    """Validate the prompts, write the work items and start the workers; prints the job id."""
    from ..batch import jobs
    from ..batch.prompts import describe

    opts = _options(kw)
    jobs.validate(opts)  # every check before the stack's bucket is made or a row written
    _ensure_bucket(kw)
    res = jobs.submit(opts)
    settings = describe(opts.prompt_list, jobs.BATCH_TIERS[opts.tier], opts.model,
                        {k: kw.get(k) for k in ("width", "height", "steps")})
    res["settings"] = settings
    note(f"{res['job']}: {res['images']} images at {settings}")
    if detach:
        res["controller_pid"] = jobs.detach(res["job"])
    else:
        view = BatchProgress(res["images"], quiet=as_json)
        try:
            res.update(jobs.run_job(res["job"], on_progress=view))
        finally:
            view.close()
        from ..batch.status import ended_reason, find_job

        why = ended_reason(find_job(res["job"]))
        if why:
            res["reason"] = why
            note(f"{res['job']} {res.get('state')}: {why}")
    if as_json:
        emit_json(res)
    else:
        click.echo(res["job"])


@batch.command("list")
@output_options
@wide_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON: one object per job.")
def list_(as_json: bool) -> None:
    """List batch jobs."""
    from ..batch import jobs

    rows = jobs.list_jobs()
    if as_json:
        emit_json(rows)
    else:
        table("batch jobs", ["job", "name", "tier", "state", "images", "workers"],
              [[r["job"], r["name"] or "", r["tier"], r["state"], r["images"], r["workers"]] for r in rows],
              drop=["workers", "name"], empty="no batch jobs yet; submit one with: sdcloud batch submit")
        for r in rows:  # why a job failed (or was stopped), one line each, under the table
            if r.get("reason"):
                echo(f"{r['job']} {r['state']}: {r['reason']}")


@batch.command()
@output_options
@wide_option
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the job's progress and cost.")
def status(job: str, as_json: bool) -> None:
    """Images done, images/s, ETA and cost so far."""
    from ..batch import jobs

    p = jobs.progress(job)
    if as_json:
        emit_json(p)
    else:
        from ..batch.status import status_value

        table(f"batch {p['job']}", ["field", "value"], [[k, status_value(k, v)] for k, v in p.items()], fold=["value"])


@batch.command()
@output_options
@click.argument("job")
@click.option("--interval", type=click.FloatRange(min=0, min_open=True), default=2.0, show_default=True, metavar="SECONDS",
              help="How often to look.")
def watch(job: str, interval: float) -> None:
    """Follow a job's progress until it ends. Exit 0 when it succeeded, 1 when it ended otherwise,
    4 when no driver is running it (as `sdcloud watch` does), 130 on Ctrl-C (the job continues)."""
    import time

    from ..batch import jobs
    from ..runs.records.state import FINAL_RUN_STATES
    from .common import EXIT_INTERRUPTED, EXIT_NO_CONTROLLER, EXIT_NOT_SUCCEEDED
    from .status import controller_note

    p = jobs.progress(job)
    view = BatchProgress(p["images"])
    # A driver that was just started writes its pid at once; give it a moment before judging.
    grace_until = time.time() + 2 * interval
    try:
        while True:
            p = jobs.progress(job)
            view(p)
            if p["state"] in FINAL_RUN_STATES:
                break
            dead = controller_note(jobs.find_job(p["job"]))
            if dead and time.time() > grace_until:
                view.close()
                click.echo(dead, err=True)
                raise SystemExit(EXIT_NO_CONTROLLER)
            time.sleep(interval)
    except KeyboardInterrupt:
        view.close()
        click.echo(f"stopped watching; job {p['job']} continues (sdcloud batch watch {p['job']} to follow it again, "
                   f"sdcloud batch cancel {p['job']} to stop it)", err=True)
        raise SystemExit(EXIT_INTERRUPTED)
    finally:
        view.close()
    click.echo(f"{p['job']} {p['state']}: {p['images_done']}/{p['images']} images, {p['redone_items']} redone")
    if p["state"] != RunState.SUCCEEDED:
        raise SystemExit(EXIT_NOT_SUCCEEDED)


@batch.command()
@output_options
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the job's state and the hosts ended.")
def cancel(job: str, as_json: bool) -> None:
    """Stop a job for good: workers stop claiming, hosts stop; the images made stay in its bucket."""
    from ..batch import jobs

    before = jobs.find_job(job)["state"]
    live = jobs.open_hosts(job)  # counted before the cancel: its driver may end them at once
    res = jobs.cancel(job)
    res["hosts_ended"] = jobs.end_hosts(res["job"], open_before=live)
    if as_json:
        emit_json(res)
        return
    hosts = f"{res['hosts_ended']} host{'s' if res['hosts_ended'] != 1 else ''} ended"
    if res["state"] == RunState.CANCELLED and before != RunState.CANCELLED:
        click.echo(f"{res['job']}: cancelled (was {before}); {hosts}; the images it made stay: "
                   f"sdcloud batch pull {res['job']}")
    else:  # an ended job keeps its end: a cancel changes nothing there
        click.echo(f"{res['job']}: already {res['state']}, nothing to cancel; {hosts}")


@batch.command()
@output_options
@click.argument("job")
@click.argument("dest", required=False)
@click.option("--force", is_flag=True, help="Write into a folder that holds other files (same names are replaced).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the images fetched and where.")
def pull(job: str, dest: str | None, force: bool, as_json: bool) -> None:
    """Download the images, index.jsonl and the gallery (index.html) into DIR (default: ./JOB).

    DIR must be new, empty, or an earlier pull of the same job; --force writes into any folder."""
    from ..batch import jobs

    res = jobs.pull(job, dest, force=force)
    emit_json(res) if as_json else click.echo(f"{res['images']} images in {res['dir']} (gallery: {res['gallery']})")


@batch.command()
@output_options
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the verdict and its counts.")
def verify(job: str, as_json: bool) -> None:
    """Check that every item's images exist exactly once and match the index.

    Exit 0: ok. Exit 1: FAILED, a job that finished whose images are not each there exactly once.
    Exit 2: incomplete, a job still running or one that ended before its last item (cancelled,
    stopped, failed); what it made is checked, and a duplicate among it is FAILED."""
    from ..batch.status import verdict
    from ..errors import UserError

    v = verdict(job)
    if as_json:
        emit_json(v)
    elif v["verdict"] != "incomplete":
        click.echo(v["says"])
    if v["verdict"] == "incomplete" and not as_json:
        raise UserError(v["says"])
    if v["verdict"] != "ok":
        raise SystemExit(2 if v["verdict"] == "incomplete" else 1)


@batch.group()
def schedule() -> None:
    """Cron schedules that submit a batch job."""


@schedule.command("add")
@output_options
@click.option("--cron", required=True, metavar="CRON", help='five fields, e.g. "0 2 * * *"')
@click.option("--tz", default=None, metavar="TIMEZONE",
              help="IANA time zone, e.g. Europe/Berlin (default UTC; Tencent: Asia/Shanghai)")
@submit_options
def schedule_add(cron: str, tz: str | None, **kw) -> None:
    """Add a schedule (the submit options are checked now, and again at each fire). With --provider aws or
    tencent it goes on that cloud's scheduler and needs no machine of yours; local and SSH use this machine's timer."""
    from ..batch import cloud_schedules, jobs, schedules

    if "," in kw["provider"]:
        from ..errors import UserError

        raise UserError(f"--provider {kw['provider']}: a schedule's jobs run in one cloud (its cloud driver holds "
                        "no keys of another); give one provider")
    tz = tz or cloud_schedules.default_tz(kw["provider"])
    schedules.check_cron(cron, tz)
    opts = _options(kw)
    jobs.validate(opts)
    if kw["provider"] in cloud_schedules.cloud_providers():
        res = cloud_schedules.add(cron, tz, opts)
        note(f"{res['id']}: {res['kind']} {res['name']} on {res['provider']}, {res['expression']} for {res['cron']} "
             f"in {res['tz']}")
        if res.get("warning"):
            note(f"warning: {res['warning']}", wrap=True)
        click.echo(res["id"])
        return
    sid = schedules.Schedules().add(cron, tz, kw | {"prompts": str(Path(kw["prompts"]).expanduser().resolve())})
    click.echo(sid)


@schedule.command("list")
@output_options
@wide_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON: one object per schedule.")
def schedule_list(as_json: bool) -> None:
    """This machine's schedules, and those on the clouds whose stacks it knows."""
    from ..batch import cloud_schedules, schedules

    rows = [{**s, "where": "this machine"} for s in schedules.Schedules().list()]
    rows += [{**s, "where": f"{s['provider']}: {s['kind']}", "cron": s["expression"], "paused": s["state"] != "ENABLED"}
             for s in cloud_schedules.listed()]
    if as_json:
        emit_json(rows)
    else:
        table("schedules", ["id", "where", "cron", "tz", "paused", "next", "last job"],
              [[s["id"], s["where"], s["cron"], s["tz"], "yes" if s["paused"] else "", s.get("next") or "",
                s.get("last_job") or ""] for s in rows],
              drop=["last job", "paused", "where"], empty="no schedules; add one with: sdcloud batch schedule add")


@schedule.command("remove")
@output_options
@click.argument("sid")
def schedule_remove(sid: str) -> None:
    """Remove a schedule: from this machine's timer, or from the cloud that has it; says what was removed."""
    from ..batch import schedule_changes

    click.echo(schedule_changes.remove_said(sid))


@schedule.command("pause")
@output_options
@click.argument("sid")
def schedule_pause(sid: str) -> None:
    """Pause a schedule (this machine's timer, or the cloud's scheduler that has it): it submits no jobs
    until resumed; says which."""
    from ..batch import schedule_changes

    click.echo(schedule_changes.set_paused_said(sid, True))


@schedule.command("resume")
@output_options
@click.argument("sid")
def schedule_resume(sid: str) -> None:
    """Resume a paused schedule (the times missed are skipped); says which and when it fires next."""
    from ..batch import schedule_changes

    click.echo(schedule_changes.set_paused_said(sid, False))


def fire(job_id: str, kw: dict) -> None:
    """A schedule's fire: submit under the given id (idempotent), run in the background."""
    from ..batch import jobs

    _ensure_bucket(kw)
    res = jobs.submit(_options(kw), job_id=job_id)
    if not res.get("existing"):
        jobs.detach(job_id)


def job_state(job_id: str) -> str | None:
    from ..runs.records.state import StateStore

    run = StateStore().get_run(job_id)
    return run["state"] if run else None


@click.group()
def scheduler() -> None:
    """Run due batch schedules (foreground), or install a timer that does."""


@scheduler.command("run")
@output_options
@click.option("--once", is_flag=True, help="One tick, then exit (for the systemd timer or cron).")
@click.option("--interval", type=click.FloatRange(min=1.0), default=30.0, show_default=True, metavar="SECONDS",
              help="How often to look (1 s or more).")
def scheduler_run(once: bool, interval: float) -> None:
    """Submit the jobs this machine's schedules have due, now and every --interval (or --once)."""
    import time

    from ..batch import schedules

    s = schedules.Schedules()
    while True:
        for job in s.tick(fire, job_state):
            note(f"submitted {job}")
        if once:
            return
        time.sleep(interval)


@scheduler.command("install")
@output_options
@click.option("--crontab", is_flag=True, help="Print a crontab line instead of writing systemd user units.")
def scheduler_install(crontab: bool) -> None:
    """Write systemd user units (or print a crontab line) that run `scheduler run --once` every minute."""
    from ..batch import schedules

    exe = shutil.which("sdcloud") or f"{sys.executable} -m sdcloud.cli"
    if crontab:
        click.echo(schedules.crontab_line(exe))
        return
    unit_dir = Path.home() / ".config" / "systemd" / "user"
    unit_dir.mkdir(parents=True, exist_ok=True)
    for name, text in schedules.systemd_units(exe).items():
        (unit_dir / name).write_text(text)
    note(f"wrote {unit_dir}/sdcloud-scheduler.{{service,timer}}; enable with: "
         "systemctl --user enable --now sdcloud-scheduler.timer (and loginctl enable-linger $USER to survive logout)")
