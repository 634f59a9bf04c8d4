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
    from sdcloud.runs.state import StateStore

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
    from sdcloud.runs.spec import build_spec

    assert build_spec(None, {"tier": "SD15-LORA", "provider": "Local"}).provider == "local"


def test_budget_eaten_by_the_shell_gets_a_hint(capsys, sdcloud_home):
    rc, _, err = run_cli(capsys, "up", "--tier", "sd15-lora", "--budget", "0")
    assert rc == 2 and "'$20'" in err


def test_down_all_asks_first(capsys, sdcloud_home, monkeypatch):
    from click.testing import CliRunner

    from sdcloud.cli import root
    from sdcloud.runs.state import StateStore

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
    from sdcloud.runs.state import StateStore

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
    from sdcloud.commands.run import ProgressView

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
    from sdcloud.commands.run import ProgressView

    now = [1000.0]
    view = ProgressView(100, quiet=False, clock=lambda: now[0])
    for step in range(1, 200):
        now[0] += 1.0
        view("progress", {"step": step // 2, "phase": "training", "it_per_s": 0.5, "cost": 0.01, "total": 100})
    lines = [line for line in capsys.readouterr().err.splitlines() if "step " in line]
    assert len(lines) == 4  # 199 s of progress: at 1 s, 61 s, 121 s and 181 s
    assert "training step 0/100" in lines[0] and "min left" in lines[1]


def test_logs_merge_controller_and_attempts_in_time_order(capsys, sdcloud_home, tmp_path):
    from sdcloud.runs.state import StateStore

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
