"""The conventions of the tools users know, and tables that fit 80 and 100 columns (issue: a CLI
people enjoy). Fast: no run trains here."""

from __future__ import annotations

import json
import re
import time

import pytest

from sdcloud.cli import main


def run_cli(capsys, *args, columns: int | None = None, monkeypatch=None) -> tuple[int, str, str]:
    if columns is not None:
        monkeypatch.setenv("COLUMNS", str(columns))
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("width", [80, 100])
def test_offers_rows_keep_every_identifier_whole(capsys, monkeypatch, sdcloud_home, width):
    rc, out, _ = run_cli(capsys, "offers", "--tier", "sdxl-lora", "--limit", "10", columns=width, monkeypatch=monkeypatch)
    assert rc == 0
    assert max(len(line) for line in out.splitlines()) <= width
    rc, js, _ = run_cli(capsys, "offers", "--tier", "sdxl-lora", "--limit", "10", "--json")
    rows = json.loads(js)
    body = out
    for r in rows:
        for ident in (r["region"], r["instance_type"], f"{r['price_per_hour_usd']:.4f}"):
            assert re.search(rf"(?<![\w.-]){re.escape(ident)}(?![\w.-])", body), f"{ident} folded or cut at {width} columns"


@pytest.mark.parametrize("width", [80, 100])
def test_tiers_names_are_never_split(capsys, monkeypatch, sdcloud_home, width):
    rc, out, _ = run_cli(capsys, "tiers", columns=width, monkeypatch=monkeypatch)
    assert rc == 0
    from sdcloud.offers.tiers import all_tiers

    for name in all_tiers():
        assert re.search(rf"│ {re.escape(name)}\s", out), f"tier {name} split at {width} columns"
    assert max(len(line) for line in out.splitlines()) <= width


@pytest.mark.parametrize("width", [80, 100])
def test_status_keeps_run_ids_whole(capsys, monkeypatch, sdcloud_home, width):
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    ids = []
    for i in range(3):
        run_id = f"r-{i:08x}"
        state.create_run(run_id, "sdxl-dreambooth", {"tier": "sdxl-dreambooth", "provider": "local"}, 1200,
                         name=f"studio-product-shoot-{i}")
        state.update_run(run_id, state="stopped")
        ids.append(run_id)
    rc, out, _ = run_cli(capsys, "status", columns=width, monkeypatch=monkeypatch)
    assert rc == 0
    for run_id in ids:
        assert run_id in out
    assert "sdxl-dreambooth" in out
    assert max(len(line) for line in out.splitlines()) <= width
    rc, wide, _ = run_cli(capsys, "status", "--wide", columns=width, monkeypatch=monkeypatch)
    assert "studio-product-shoot-0" in wide  # --wide keeps every column


def test_spot_and_on_demand_exclude_each_other(capsys, sdcloud_home):
    rc, _, err = run_cli(capsys, "up", "--tier", "sd15-lora", "--spot", "--on-demand")
    assert rc == 2 and "exclude each other" in err and len(err.strip().splitlines()) == 1
    rc, _, err = run_cli(capsys, "offers", "--tier", "sd15-lora", "--spot", "--on-demand")
    assert rc == 2


def test_spot_and_on_demand_in_one_run_file_is_refused(capsys, sdcloud_home, tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("tier: sd15-lora\nspot: true\non-demand: true\n")
    rc, _, err = run_cli(capsys, "up", "-f", str(f))
    assert rc == 2 and "exclude each other" in err


def test_names_are_case_insensitive_with_did_you_mean(capsys, sdcloud_home):
    rc, out, _ = run_cli(capsys, "offers", "--tier", "SDXL-LoRA", "--limit", "1", "--json")
    assert rc == 0 and json.loads(out)
    rc, _, err = run_cli(capsys, "offers", "--tier", "sdxl-lroa")
    assert rc == 2 and "did you mean sdxl-lora" in err
    rc, _, err = run_cli(capsys, "up", "--tier", "sd15-lora", "--provider", "locl")
    assert rc == 2 and "did you mean local" in err
    from sdcloud.runs.inputs.spec import build_spec

    assert build_spec(None, {"tier": "SD15-LORA", "provider": "Local"}).spec.provider == "local"


def test_budget_eaten_by_the_shell_gets_a_hint(capsys, sdcloud_home):
    rc, _, err = run_cli(capsys, "up", "--tier", "sd15-lora", "--budget", "0")
    assert rc == 2 and "'$20'" in err


def test_down_all_asks_first(capsys, sdcloud_home, monkeypatch):
    from click.testing import CliRunner

    from sdcloud.cli import root
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    state.create_run("r-aaaa0001", "sd15-lora", {"tier": "sd15-lora", "provider": "local"}, 10)
    state.update_run("r-aaaa0001", state="running")
    result = CliRunner().invoke(root, ["down", "--all"], input="n\n")
    assert "Stop 1 run(s): r-aaaa0001?" in result.output
    assert result.exit_code != 0
    assert StateStore().get_run("r-aaaa0001")["state"] == "running"  # nothing was stopped


def test_metavars_say_what_a_value_is(capsys):
    from click.testing import CliRunner

    from sdcloud.cli import root

    help_text = CliRunner().invoke(root, ["up", "--help"]).output
    for option, metavar in (("--budget", "USD"), ("--deadline", "DURATION"), ("--steps", "N"), ("--dataset", "PATH"),
                            ("--max-price", "USD")):
        assert re.search(rf"{option} {metavar}\b", help_text), (option, metavar)
    assert "TEXT" not in help_text
    assert "-q, --quiet" in help_text and "-v, --verbose" in help_text


def test_completion_names_tiers_providers_and_runs(sdcloud_home):
    from sdcloud.commands.common import complete_providers, complete_runs, complete_tiers
    from sdcloud.runs.records.state import StateStore

    StateStore().create_run("r-cafe0001", "sd15-lora", {"tier": "sd15-lora"}, 10, name="cats")
    assert complete_tiers(None, None, "sdxl") == ["sdxl-lora", "sdxl-dreambooth", "sdxl-finetune"]
    assert complete_providers(None, None, "t") == ["tencent"]
    assert set(complete_runs(None, None, "")) >= {"r-cafe0001", "cats"}


def test_config_defaults_fill_what_was_not_given(capsys, sdcloud_home):
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text('[defaults]\nprovider = "aws"\ntier = "sdxl-lora"\n')
    rc, out, _ = run_cli(capsys, "config", "show", "--json")
    shown = json.loads(out)
    assert shown["defaults.provider"] == {"value": "aws", "source": "config.toml [defaults]"}
    from sdcloud import config

    assert config.defaults() == {"provider": "aws", "tier": "sdxl-lora"}
    (sdcloud_home / "config.toml").write_text('[defaults]\nzone = "x"\n')
    rc, _, err = run_cli(capsys, "config", "show")
    assert rc == 2 and "unknown key" in err


def test_events_are_shown_at_their_own_time_in_plain_words(capsys):
    from sdcloud.verbs.progress_view import ProgressView

    view = ProgressView(40, quiet=False, clock=lambda: 1_800_000_000.0)
    happened = time.mktime((2026, 12, 1, 3, 4, 5, 0, 0, -1))
    view("reclaimed", {"attempt": 1, "instance": "i-1", "phase": "preempted", "step": 17}, at=happened)
    view("resumed", {"attempt": 2, "from_step": 17, "lost_steps": 0, "zone": "us-east-1c", "instance_type": "g5.xlarge"},
         at=happened + 60)
    err = capsys.readouterr().err
    assert "[03:04:05] spot reclaim of attempt 1 at step 17: the host saved its checkpoint" in err
    assert "[03:05:05] attempt 2 on g5.xlarge in us-east-1c resumed from step 17, 0 steps lost" in err
    assert "phase=preempted" not in err  # key=value is for -v


def test_piped_progress_prints_a_line_a_minute(capsys):
    from sdcloud.verbs.progress_view import ProgressView

    now = [1000.0]
    view = ProgressView(100, quiet=False, clock=lambda: now[0])
    for step in range(1, 200):
        now[0] += 1.0
        view("progress", {"step": step // 2, "phase": "training", "it_per_s": 0.5, "cost": 0.01, "total": 100})
    lines = [line for line in capsys.readouterr().err.splitlines() if "step " in line]
    assert len(lines) == 4  # 199 s of progress: at 1 s, 61 s, 121 s and 181 s
    assert "training step 0/100" in lines[0] and "min left" in lines[1]


def test_logs_merge_controller_and_attempts_in_time_order(capsys, sdcloud_home, tmp_path):
    from sdcloud.runs.records.state import StateStore

    bucket = tmp_path / "bucket"
    state = StateStore()
    spec = {"tier": "sd15-lora", "provider": "local", "store": bucket.as_uri()}
    state.create_run("r-0000beef", "sd15-lora", spec, 10)
    base = time.mktime((2026, 12, 1, 10, 0, 0, 0, 0, -1))
    logs = bucket / "runs" / "r-0000beef" / "logs"
    logs.mkdir(parents=True)

    def stamp(sec):
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(base + sec)) + ",000"

    (logs / "attempt-1.log").write_text(f"{stamp(1)} INFO sdcloud_agent: a1 first\n{stamp(5)} INFO sdcloud_agent: a1 last\n"
                                        f'{stamp(5)} INFO sdcloud_agent.trainer: SDCLOUD_STEP {{"step": 3}}\n')
    (logs / "attempt-2.log").write_text(f"{stamp(8)} INFO sdcloud_agent: a2 first\nTraceback without a time\n")
    with state.tx() as db:
        for sec, kind, attempt in ((0, "launching", 1), (6, "reclaimed", 1), (7, "launching", 2), (9, "run-succeeded", None)):
            db.execute("INSERT INTO events (run_id, time, kind, data) VALUES (?,?,?,?)",
                       ("r-0000beef", base + sec, kind, json.dumps({"attempt": attempt} if attempt else {})))
    rc, out, _ = run_cli(capsys, "logs", "r-0000beef")
    assert rc == 0
    order = [next(tag for tag in ("launching", "a1 first", "a1 last", "reclaim", "a2 first", "Traceback", "run succeeded")
                  if tag in line) for line in out.splitlines() if any(t in line for t in
                  ("launching", "a1 first", "a1 last", "reclaim", "a2 first", "Traceback", "run succeeded"))]
    assert order == ["launching", "a1 first", "a1 last", "reclaim", "launching", "a2 first", "Traceback", "run succeeded"]
    assert "SDCLOUD_STEP" not in out
    rc, out, _ = run_cli(capsys, "logs", "r-0000beef", "--steps", "--attempt", "1", "--json")
    records = [json.loads(line) for line in out.splitlines()]
    assert any("SDCLOUD_STEP" in r["text"] for r in records)
    assert {r["attempt"] for r in records} <= {1, None} and not any("a2 first" in r["text"] for r in records)
    rc, out, _ = run_cli(capsys, "logs", "r-0000beef", "--tail", "2")
    assert len(out.splitlines()) == 2 and "run succeeded" in out.splitlines()[-1]


# -- every table at 80 columns (issue 23: output that fits) -------------------------------------------
T_RUNS = 1_793_577_600.0  # 2026-11-02 00:00 UTC: the runs' attempts start here


def _row(provider: str, region: str, zone: str, itype: str, gpu: str, od: float, spot: float, currency: str = "USD"):
    from sdcloud.offers.catalog import CatalogRow

    return CatalogRow(provider=provider, region=region, zone=zone, instance_type=itype, gpu=gpu, gpu_count=1, vram_gb=24,
                      vcpus=8, memory_gb=32, nvme_gb=0, ondemand_price=od, spot_price=spot, currency=currency,
                      interruption_band=2, snapshot_date="2026-11-01", ondemand_estimate=False, spot_estimate=False,
                      source="test")


def _attempt(state, run_id: str, n: int, row, market: str, start: float, end: float | None, reason: str | None,
             first_step_at: float | None = None, start_step: int | None = None, last_step: int | None = None) -> None:
    """One attempt of a run, through the calls the controller makes (ledger.started, observe, closed)."""
    from sdcloud.costs import ledger
    from sdcloud.offers.optimizer import Offer

    state.add_attempt(run_id, n, row.provider, f"tok{n}", region=row.region, zone=row.zone, instance_type=row.instance_type,
                      market=market, price=row.spot_price if market == "spot" else row.ondemand_price, currency=row.currency)
    state.update_attempt(run_id, n, state="running", start=start, instance_id=f"i-{run_id}-{n}")
    ledger.started(state, run_id, n, Offer(row, market), market, 100, zone=row.zone, at=start)
    if first_step_at is not None:
        state.set_attempt_costs(run_id, n, first_step_at=first_step_at, start_step=start_step, last_step=last_step,
                                it_per_s=1.0)
    elif last_step is not None:
        state.set_attempt_costs(run_id, n, last_step=last_step, it_per_s=1.0)
    if end is not None:
        state.update_attempt(run_id, n, state="ended", end=end, end_reason=reason)
        ledger.closed(state, run_id, n)


@pytest.fixture
def populated(sdcloud_home, tmp_path):
    """A state store with what a user accumulates: training runs on AWS and Tencent (reclaimed, on-demand,
    succeeded), one that never launched, a batch job, and a schedule."""
    from sdcloud.batch import jobs, schedules
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    aws = _row("aws", "us-east-1", "us-east-1a", "g5.xlarge", "A10G", 1.006, 0.40)
    tencent = _row("tencent", "ap-guangzhou", "ap-guangzhou-3", "GN10Xp.2XLARGE40", "V100-32GB", 20.0, 6.0, "CNY")
    state.create_run("r-0a0a0a0a", "sdxl-dreambooth", {"tier": "sdxl-dreambooth", "provider": "aws"}, 3000,
                     name="studio-product-shoot-autumn")
    _attempt(state, "r-0a0a0a0a", 1, aws, "spot", T_RUNS, T_RUNS + 2400, "preempted", last_step=900)
    _attempt(state, "r-0a0a0a0a", 2, aws, "on-demand", T_RUNS + 3000, T_RUNS + 9000, "succeeded",
             first_step_at=T_RUNS + 3300, start_step=800)
    state.update_run("r-0a0a0a0a", state="succeeded", step=3000)
    state.create_run("r-0b0b0b0b", "sd15-lora", {"tier": "sd15-lora", "provider": "tencent"}, 1500, name="cats")
    _attempt(state, "r-0b0b0b0b", 1, tencent, "spot", T_RUNS + 600, T_RUNS + 4200, "succeeded")
    state.update_run("r-0b0b0b0b", state="succeeded", step=1500)
    state.create_run("r-0c0c0c0c", "sdxl-lora", {"tier": "sdxl-lora", "provider": "local"}, 10)
    state.update_run("r-0c0c0c0c", state="stopped")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cube\na blue sphere\n")
    job = jobs.submit(jobs.SubmitOptions(tier="batch-sd15", model="tiny", prompts=str(prompts), generator="fake",
                                         name="nightly-gallery-renders"))["job"]
    sid = schedules.Schedules().add("0 2 * * *", "Europe/Berlin", {"tier": "batch-sd15", "model": "tiny",
                                                                  "prompts": str(prompts)})
    trace = tmp_path / "z1.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1] * 50}))
    return {"runs": ["r-0a0a0a0a", "r-0b0b0b0b", "r-0c0c0c0c"], "job": job, "schedule": sid, "trace": str(trace)}


def _headers(out: str) -> list[list[str]]:
    """The column names of each rich table in `out` (a header that wraps is joined up again)."""
    names: list[list[str]] = []
    lines = out.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith("┏"):
            cols: list[str] | None = None
            i += 1
            while i < len(lines) and not lines[i].lstrip().startswith(("┡", "┗")):
                cells = [c.strip() for c in lines[i].strip().strip("┃").split("┃")]
                cols = cells if cols is None else [f"{a} {b}".strip() for a, b in zip(cols, cells)]
                i += 1
            names.append(cols or [])
        i += 1
    return names


def _hidden(out: str) -> list[str]:
    found = re.findall(r"hidden to fit: (.*?); --wide shows them", " ".join(out.split()))
    return [name for line in found for name in line.split(", ")]


def _whole(ident: str, text: str) -> bool:
    return re.search(rf"(?<![\w.-]){re.escape(ident)}(?![\w.-])", text) is not None


# Each command, and what must appear whole in its output at 80 columns (from the populated state).
TABLE_COMMANDS = {
    "status": (["status"], lambda p: p["runs"] + [p["job"]]),
    "status RUN": (["status", "r-0a0a0a0a"], lambda p: ["r-0a0a0a0a", "us-east-1a", "g5.xlarge", "preempted"]),
    "cost report": (["cost", "report", "--all"],
                    lambda p: p["runs"] + [p["job"], "us-east-1a", "g5.xlarge", "ap-guangzhou-3", "GN10Xp.2XLARGE40"]),
    "cost report --by": (["cost", "report", "--all", "--by", "tier"], lambda p: ["sdxl-dreambooth", "sd15-lora", "batch-sd15"]),
    "offers": (["offers", "--tier", "sdxl-lora", "--provider", "aws,tencent", "--move-gb", "0"],
               lambda p: ["g6e.xlarge", "us-west-2"]),
    "offers --explain": (["offers", "--tier", "sdxl-lora", "--provider", "aws,tencent", "--move-gb", "0", "--explain"],
                         lambda p: ["g6e.xlarge", "us-west-2", "ap-singapore"]),
    "offers, a marketplace's machines": (["offers", "--tier", "sdxl-lora", "--provider", "vast"],
                                         lambda p: ["2x-RTX_3090-32-65536", "1x-RTX_4090-32-65536"]),
    "offers --provider": (["offers", "--tier", "sd15-lora", "--provider", "tencent", "--limit", "0"],
                          lambda p: ["ap-guangzhou", "GN10Xp.2XLARGE40"]),
    "tiers": (["tiers"], lambda p: ["sdxl-dreambooth", "batch-sdxl"]),
    "catalog show": (["catalog", "show", "--provider", "tencent"], lambda p: ["ap-guangzhou", "GN10Xp.2XLARGE40"]),
    "config show": (["config", "show"], lambda p: ["defaults.provider", "currency.cny_per_usd"]),
    "batch list": (["batch", "list"], lambda p: [p["job"], "batch-sd15"]),
    "batch status": (["batch", "status", "JOB"], lambda p: [p["job"], "images_done"]),
    "batch schedule list": (["batch", "schedule", "list"], lambda p: [p["schedule"], "Europe/Berlin"]),
    "simulate": (["simulate", "--trace", "TRACE", "--job-hours", "1", "--deadline-hours", "2", "--restart-hours", "0.2",
                  "--starts", "3"], lambda p: ["uniform-progress", "on-demand"]),
}


@pytest.mark.parametrize("name", list(TABLE_COMMANDS))
def test_every_table_fits_80_columns_and_names_what_it_hides(capsys, monkeypatch, populated, name):
    args, idents = TABLE_COMMANDS[name]
    args = [{"JOB": populated["job"], "TRACE": populated["trace"]}.get(a, a) for a in args]
    rc, wide, _ = run_cli(capsys, *args, "--wide", columns=80, monkeypatch=monkeypatch)
    assert rc == 0
    rc, out, err = run_cli(capsys, *args, columns=80, monkeypatch=monkeypatch)
    assert rc == 0, err
    too_long = [line for line in (out + err).splitlines() if len(line) > 80]
    assert not too_long, f"{name}: lines wider than 80 columns: {too_long}"
    for ident in idents(populated):
        assert _whole(ident, out), f"{name}: {ident} cut or missing at 80 columns"
    shown, every = _headers(out), _headers(wide)
    assert shown and len(shown) == len(every)
    # Whatever --wide shows and 80 columns do not is named on the hidden-columns line, and nothing else.
    missing = {c for narrow, full in zip(shown, every) for c in full if c not in narrow}
    assert all(set(narrow) <= set(full) for narrow, full in zip(shown, every))
    if name == "offers --explain":
        # The explanation is the point: what the table cannot hold is in a line per row under it.
        assert not _hidden(out) and missing
        rows = [line for line in out.splitlines() if re.match(r"\d+\. ", line)]
        assert rows and all("price" in r for r in rows)
        assert out.count("overhead ") >= len(rows) and out.count("speed ") >= len(rows)
    else:
        assert missing == set(_hidden(out)), name
    assert not _hidden(wide)


def test_offers_footer_explains_only_the_columns_it_shows(capsys, monkeypatch, sdcloud_home):
    rc, out, _ = run_cli(capsys, "offers", "--tier", "sdxl-lora", columns=80, monkeypatch=monkeypatch)
    assert rc == 0
    flat = " ".join(out.split())
    assert "est h" in _hidden(out) and "VRAM" in _hidden(out)
    assert "est h" not in _headers(out)[0] and "est $ = $/h x est h" not in flat and "VRAM =" not in flat
    rc, out, _ = run_cli(capsys, "offers", "--tier", "sdxl-lora", "--wide", columns=80, monkeypatch=monkeypatch)
    flat = " ".join(out.split())
    assert "est h" in _headers(out)[0] and "est $ = $/h x est h" in flat and "VRAM = usable" in flat


def test_stale_price_warning_wraps_between_words(capsys, monkeypatch, sdcloud_home):
    from datetime import datetime, timezone

    from sdcloud import clock
    from sdcloud.offers.catalog import load_catalog, stale_warning

    monkeypatch.setattr(clock, "utc_now", lambda: datetime(2026, 12, 1, 23, 59, tzinfo=timezone.utc))
    warning = stale_warning(load_catalog().sources)
    assert warning and len(warning) > 80  # the bundled catalog is older than max_age_days at that date
    rc, _, err = run_cli(capsys, "offers", "--tier", "sdxl-lora", "--limit", "1", columns=80, monkeypatch=monkeypatch)
    assert rc == 0
    assert max(len(line) for line in err.splitlines()) <= 80
    # Every word of the warning is whole on some line, in order: the lines join back into the warning.
    assert " ".join(warning.split()) in " ".join(err.split())
    start = next(i for i, line in enumerate(err.splitlines()) if line.startswith("warning:"))
    assert all(line.startswith("  ") for line in err.splitlines()[start + 1:])  # continuation lines, indented
    monkeypatch.delenv("COLUMNS")  # piped, as into grep or a log: one line
    main(["offers", "--tier", "sdxl-lora", "--limit", "1"])
    assert warning in capsys.readouterr().err.splitlines()


def test_reconcile_keeps_the_flag_at_80_columns(capsys, monkeypatch, sdcloud_home):
    """The bill itself comes from the clouds (tests/costs/test_cost_reconcile.py); here only its table."""
    from sdcloud.costs import reconcile

    rows = [{"run": "r-0a0a0a0a", "provider": "tencent", "estimate_usd": 1.7071, "billed_usd": 2.1,
             "difference_usd": 0.3929, "difference_pct": 23.0, "flag": "off"},
            {"run": "r-0b0b0b0b", "provider": "aws", "estimate_usd": 0.852, "billed_usd": None, "difference_usd": None,
             "difference_pct": None, "flag": "no bill yet"}]
    monkeypatch.setattr(reconcile, "reconcile", lambda state, since_seconds, threshold_pct: rows)
    rc, out, _ = run_cli(capsys, "cost", "reconcile", columns=80, monkeypatch=monkeypatch)
    assert rc == 0 and max(len(line) for line in out.splitlines()) <= 80
    (shown,) = _headers(out)
    assert {"run", "estimate $", "billed $", "difference %", "flag"} <= set(shown)
    for ident in ("r-0a0a0a0a", "r-0b0b0b0b", "off", "no bill yet", "23.0", "2.1000"):
        assert _whole(ident, out), ident
    assert set(_hidden(out)) == {"difference $"}


def _every_command():
    import click

    from sdcloud.cli import root

    def walk(cmd, path, ctx):
        yield path, cmd, ctx
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                yield from walk(sub, [*path, name], click.Context(sub, info_name=name, parent=ctx))

    yield from walk(root, ["sdcloud"], click.Context(root, info_name="sdcloud"))


def test_help_metavars_say_what_each_option_takes():
    """Issue 39: no TEXT, INTEGER or FLOAT in --help: a duration, a region, seconds, a URL, a cron, a zone..."""
    import click

    vague = re.compile(r"\b(TEXT|INTEGER|FLOAT|BOOLEAN)\b")
    found = []
    for path, cmd, ctx in _every_command():
        for p in cmd.params:
            if isinstance(p, click.Option) and (p.is_flag or p.hidden or p.count):
                continue
            if vague.search(p.make_metavar(ctx)):
                found.append(f"{' '.join(path)} {p.opts[0]}")
    assert found == [], found
    assert len(list(_every_command())) > 30  # the walk reached every command, lazily loaded ones too


def test_a_command_missing_what_it_requires_says_so_in_one_line(capsys, sdcloud_home):
    """Every command with a required option or argument, given none: exit 2, one line on stderr that
    names what is missing (click lists a choice option's values one a line), nothing on stdout."""
    import click

    tried = 0
    for path, cmd, _ in _every_command():
        if isinstance(cmd, click.Group) or not any(p.required for p in cmd.params):
            continue
        tried += 1
        rc = main(path[1:])
        out = capsys.readouterr()
        assert rc == 2 and out.out == "", (path, rc, out.out)
        lines = out.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "--help" in lines[0], (path, out.err)
    assert tried > 10


@pytest.mark.parametrize("args,says", [
    (["status"], "no runs yet; start one with: sdcloud up --tier TIER"),
    (["batch", "list"], "no batch jobs yet; submit one with: sdcloud batch submit"),
    (["batch", "schedule", "list"], "no schedules; add one with: sdcloud batch schedule add"),
    (["cost", "report"], "no runs or batch jobs to report: nothing was spent"),
])
def test_a_list_with_nothing_in_it_says_so_and_how_to_start(capsys, sdcloud_home, args, says):
    """A new user's first look: one line saying there is nothing yet and the command that makes one,
    not an empty table's frame (or a total of $0 over 0 runs)."""
    rc, out, err = run_cli(capsys, *args)
    assert rc == 0 and err == "" and out.strip().splitlines() == [out.strip()] and out.startswith(says), out


@pytest.mark.parametrize("args", [
    ["watch", "r-00000000", "--interval", "0"],  # a zero or negative wait would spin or raise in sleep()
    ["batch", "watch", "b-00000000", "--interval", "-1"],
    ["scheduler", "run", "--interval", "0.5"],
    ["infra", "up", "--provider", "aws", "--region", "us-east-1", "--root-volume-gb", "0"],
    ["infra", "preview", "--provider", "aws", "--region", "us-east-1", "--checkpoint-expire-days", "-1"],
])
def test_a_number_out_of_its_range_is_refused_before_anything_runs(capsys, sdcloud_home, args):
    rc, out, err = run_cli(capsys, *args)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "is not in the range" in err, err


def test_a_group_given_no_command_shows_its_help(capsys):
    """`sdcloud`, `sdcloud batch`, `sdcloud batch schedule`...: the group's help on stdout, exit 0, as
    `--help` gives it (not the help squeezed into an error line)."""
    import click

    groups = [path for path, cmd, _ in _every_command() if isinstance(cmd, click.Group)]
    assert len(groups) >= 7
    for path in groups:
        assert main(path[1:]) == 0, path
        out = capsys.readouterr()
        assert out.err == "" and out.out.startswith(f"Usage: {' '.join(path)} ") and "Commands:" in out.out, (path, out)


def test_verbosity_is_per_command_not_left_by_the_last_one(capsys):
    # In one process (a shell's completion, a test, a notebook) -v or -q on one command must not
    # change what the next command without them prints.
    from sdcloud import render
    from sdcloud.cli import main

    assert main(["tiers", "-q"]) == 0 and render.VERBOSITY == -1
    assert main(["tiers"]) == 0 and render.VERBOSITY == 0
    assert main(["tiers", "-v"]) == 0 and render.VERBOSITY == 1
    assert main(["tiers"]) == 0 and render.VERBOSITY == 0
    capsys.readouterr()


def test_batch_progress_lines_say_an_unknown_eta_in_words(capsys):
    from sdcloud.commands.batch import BatchProgress

    progress = BatchProgress(3)  # not a terminal here: one line per change
    progress({"images_done": 0, "images": 3, "images_per_s": 0.0, "eta_s": None, "cost_usd": None})
    progress({"images_done": 1, "images": 3, "images_per_s": 0.135, "eta_s": 14.8, "cost_usd": 0.0012})
    progress.close()
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln]
    assert lines == ["0/3 images, 0.0 images/s, ETA unknown, cost $0.0000",
                     "1/3 images, 0.135 images/s, ETA 15 s, cost $0.0012"], lines
