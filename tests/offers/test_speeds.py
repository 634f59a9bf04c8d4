"""Recorded and observed rates: the state store's table, `sdcloud speeds`, and what `offers`, the
checks before launch and every finished attempt do with them."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from sdcloud.cli import main
from sdcloud.offers.catalog import load_catalog
from sdcloud.offers.optimizer import rank
from sdcloud.offers.rates import gpu_rate
from sdcloud.offers.tiers import get_tier
from sdcloud.runs.records.state import StateStore
from sdcloud.speeds import records
from sdcloud.runs.driving.lessons import user_book
from sdcloud.speeds.book import Book, load_book
from sdcloud.speeds.observe import learn, steady_rate


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def offers_json(capsys, *args) -> list[dict]:
    code, out, err = run_cli(capsys, "offers", *args, "--json", "--limit", "0")
    assert code == 0, err
    return json.loads(out)


def observe(state, run_id: str, n: int, rate: float, gpu: str = "L40S", provider: str = "aws",
            instance_type: str = "g6e.xlarge", trainer: str = "builtin", recipe: str = "", tier: str = "sdxl-lora",
            **more) -> None:
    records.put_observed(state, run_id, n, provider=provider, instance_type=instance_type, gpu=gpu, gpu_count=1,
                         tier=tier, trainer=trainer, recipe=recipe, rate=rate, **more)


# -- the acceptance: a recorded figure takes the catalog's place ---------------------------------------
def test_speeds_add_gives_every_single_l40s_offer_that_rate(capsys, sdcloud_home):
    before = {(r["provider"], r["region"], r["instance_type"], r["market"]): r
              for r in offers_json(capsys, "--tier", "sdxl-lora")}
    code, out, err = run_cli(capsys, "speeds", "add", "--gpu", "L40S", "--tier", "sdxl-lora", "--rate", "0.9")
    assert code == 0, err
    after = offers_json(capsys, "--tier", "sdxl-lora")
    l40s = [r for r in after if r["gpu"] == "L40S" and r["gpu_count"] == 1]
    assert l40s
    for r in l40s:
        assert r["rate"] == 0.9 and r["rate_source"].startswith("recorded")
        old = before[(r["provider"], r["region"], r["instance_type"], r["market"])]
        # The estimate follows the slower rate: 3000 steps at 0.9 instead of the model's ~1.53.
        assert r["est_hours"] > old["est_hours"] * 1.3
        work = (r["est_hours"] / r["overhead"] - 0.15) * 3600
        assert work == pytest.approx(3000 / 0.9, rel=1e-3)
    # ... and the rank: the list is ordered by the new estimates.
    costs = [r["est_cost"] for r in after]
    assert costs == sorted(costs)
    others = [r for r in after if r["gpu"] != "L40S"]
    assert all(not r["rate_source"].startswith("recorded") for r in others)


def test_a_recorded_rate_moves_offers_down_the_ranking():
    tier = get_tier("sdxl-lora")
    catalog = load_catalog(["aws"])
    plain = rank(tier, catalog, market="on-demand")
    slow = Book([_recorded("L40S", 0.2)])
    ranked = rank(tier, catalog, market="on-demand", book=slow)
    first_l40s = lambda rs: next(i for i, e in enumerate(rs) if e.offer.row.gpu == "L40S")  # noqa: E731
    assert first_l40s(ranked) > first_l40s(plain)


def _recorded(gpu: str, rate: float, tier: str = "sdxl-lora", trainer: str = "", provider: str = "",
              instance_type: str = "", at: float = 1.0, row_id: int = 1, gpu_count: int = 1) -> records.SpeedRow:
    return records.SpeedRow(row_id, records.RECORDED, provider, instance_type, gpu, gpu_count, tier, trainer, "", "", "",
                            rate, None, None, None, None, False, None, None, "", at)


# -- the command ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, needle", [
    (["speeds", "add", "--gpu", "L40S", "--tier", "sdxl-lora", "--rate", "0"], "--rate must be a positive"),
    (["speeds", "add", "--gpu", "L40S", "--tier", "sdxl-lora", "--rate", "-2"], "--rate must be a positive"),
    (["speeds", "add", "--gpu", "L40S", "--tier", "sdxl-lora", "--rate", "inf"], "--rate must be a positive"),
    (["speeds", "add", "--gpu", "X9", "--tier", "sdxl-lora", "--rate", "1"], "unknown GPU 'X9'"),
    (["speeds", "add", "--gpu", "L40S", "--tier", "nope", "--rate", "1"], "unknown tier"),
    (["speeds", "add", "--gpu", "L40S", "--tier", "sdxl-lora"], "needs --rate"),
    (["speeds", "add", "--gpu", "L40S", "--tier", "sdxl-lora", "--rate", "1", "--trainer", "nope"], "unknown trainer"),
    (["speeds", "add", "--gpu", "L40S", "--tier", "sdxl-lora", "--rate", "fast"], "--rate"),
    (["speeds", "forget"], "say which figures to forget"),
    (["speeds", "forget", "--gpu", "L40S"], "no figure matches"),
    (["speeds", "--rate", "2"], "takes no --rate"),
    (["speeds", "fly"], "unknown action 'fly'"),
])
def test_speeds_bad_input_is_one_line_exit_2_nothing_recorded(capsys, sdcloud_home, args, needle):
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and needle in err, err
    if (sdcloud_home / "state.db").exists():
        assert records.rows(StateStore()) == []


def test_speeds_lists_adds_replaces_and_forgets(capsys, sdcloud_home):
    code, out, _ = run_cli(capsys, "speeds")
    assert code == 0 and "no rates yet" in out
    assert run_cli(capsys, "speeds", "add", "--gpu", "l40s", "--tier", "SDXL-LoRA", "--rate", "0.9",
                   "--trainer", "kohya", "--note", "my bench")[0] == 0
    assert run_cli(capsys, "speeds", "add", "--gpu", "L40S", "--tier", "sdxl-lora", "--rate", "1.1",
                   "--trainer", "kohya")[0] == 0  # the same key: replaced
    code, out, _ = run_cli(capsys, "speeds", "--json")
    got = json.loads(out)
    assert len(got) == 1
    g = got[0]
    assert (g["gpu"], g["tier"], g["trainer"], g["origin"], g["rate"]) == ("L40S", "sdxl-lora", "kohya", "recorded", 1.1)
    assert g["catalog_rate"] == pytest.approx(gpu_rate(get_tier("sdxl-lora"), "L40S"), rel=1e-3)
    assert g["last_seen"] > 0 and g["catalog_source"].startswith("model: ")
    code, out, _ = run_cli(capsys, "speeds", "forget", "--gpu", "L40S", "--tier", "sdxl-lora")
    assert code == 0 and "forgot 1 figure" in out
    assert json.loads(run_cli(capsys, "speeds", "--json")[1]) == []


def test_forget_keeps_observed_figures_unless_asked(capsys, sdcloud_home):
    state = StateStore()
    observe(state, "r-1", 1, 1.2)
    records.add_recorded(state, "L40S", "sdxl-lora", 0.9)
    assert run_cli(capsys, "speeds", "forget", "--gpu", "L40S")[0] == 0
    assert [r.origin for r in records.rows(state)] == ["observed"]
    assert run_cli(capsys, "speeds", "forget", "--gpu", "L40S", "--observed")[0] == 0
    assert records.rows(state) == []


def test_export_has_every_row_and_the_reclaims_per_zone(capsys, sdcloud_home):
    state = StateStore()
    observe(state, "r-1", 1, 1.2, zone="us-east-1a", market="spot", hours=2.0, reclaimed=1)
    observe(state, "r-1", 2, 1.3, zone="us-east-1a", market="spot", hours=2.0, reclaimed=0)
    observe(state, "r-2", 1, 1.3, zone="us-east-1b", market="on-demand", hours=5.0, reclaimed=0)
    code, out, _ = run_cli(capsys, "speeds", "export")
    doc = json.loads(out)
    assert code == 0 and len(doc["rows"]) == 3
    assert doc["reclaims_per_hour"] == {"aws/us-east-1a": 0.25}


def test_the_speeds_table_fits_80_columns(capsys, sdcloud_home, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    state = StateStore()
    observe(state, "r-1", 1, 1.2, instance_type="g6e.12xlarge")
    records.add_recorded(state, "A100-80GB", "sd35m-dreambooth", 0.5, note="a long note about where it came from")
    code, out, _ = run_cli(capsys, "speeds")
    assert code == 0
    assert all(len(line) <= 80 for line in out.splitlines()), out
    assert "sd35m-dreambooth" in out and "observed" in out


# -- the state store ---------------------------------------------------------------------------------------
def test_an_old_state_db_opens_and_gains_the_table(sdcloud_home):
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    path = sdcloud_home / "state.db"
    db = sqlite3.connect(path)
    db.executescript("CREATE TABLE runs (id TEXT PRIMARY KEY, name TEXT, tier TEXT NOT NULL, state TEXT NOT NULL, "
                     "spec TEXT NOT NULL, step INTEGER NOT NULL DEFAULT 0, total_steps INTEGER NOT NULL DEFAULT 0, "
                     "reason TEXT, controller_pid INTEGER, created REAL NOT NULL, updated REAL NOT NULL);"
                     "INSERT INTO runs VALUES ('r-old', NULL, 'sd15-lora', 'succeeded', '{\"tier\": \"sd15-lora\"}', "
                     "5, 5, NULL, NULL, 1.0, 2.0);")
    db.commit()
    db.close()
    state = StateStore(path)
    assert state.get_run("r-old")["state"] == "succeeded"
    assert records.rows(state) == []
    records.add_recorded(state, "A10G", "sd15-lora", 2.2)
    assert [r.rate for r in records.rows(state)] == [2.2]


def test_learning_an_attempt_twice_keeps_one_row(sdcloud_home):
    state = StateStore()
    observe(state, "r-1", 1, 1.0)
    observe(state, "r-1", 1, 1.5)
    assert [r.rate for r in records.rows(state)] == [1.5]


def test_offers_without_a_state_store_make_none(capsys, sdcloud_home):
    offers_json(capsys, "--tier", "sd15-lora")
    assert not (sdcloud_home / "state.db").exists()
    assert user_book().rows == []


# -- which figure wins ---------------------------------------------------------------------------------------
def test_observed_beats_recorded_and_says_how_many_runs(sdcloud_home):
    state = StateStore()
    records.add_recorded(state, "L40S", "sdxl-lora", 0.9)
    for i, rate in enumerate((1.0, 1.2, 2.0)):
        observe(state, f"r-{i}", 1, rate, instance_type="g6e.2xlarge")
    book = load_book(state)
    got = book.rate(get_tier("sdxl-lora"), "aws", "g6e.xlarge", "L40S", 1)
    assert got.value == pytest.approx(1.2) and got.source == "observed: 3 runs" and got.origin == "observed"


def test_the_same_host_type_beats_the_same_gpu(sdcloud_home):
    state = StateStore()
    observe(state, "r-1", 1, 1.0, instance_type="g6e.2xlarge")
    observe(state, "r-2", 1, 1.4, instance_type="g6e.xlarge")
    book = load_book(state)
    tier = get_tier("sdxl-lora")
    assert book.rate(tier, "aws", "g6e.xlarge", "L40S", 1).value == pytest.approx(1.4)
    assert book.rate(tier, "aws", "g6e.2xlarge", "L40S", 1).value == pytest.approx(1.0)
    assert book.rate(tier, "aws", "g6e.4xlarge", "L40S", 1).value == pytest.approx(1.2)  # both, median
    assert book.rate(tier, "aws", "g5.xlarge", "A10G", 1) is None
    assert book.rate(get_tier("sd15-lora"), "aws", "g6e.xlarge", "L40S", 1) is None


def test_the_tiny_model_and_other_trainers_do_not_stand_for_the_tier(sdcloud_home):
    state = StateStore()
    observe(state, "r-1", 1, 40.0, recipe="tiny")
    observe(state, "r-2", 1, 1.1, trainer="kohya")
    tier = get_tier("sdxl-lora")
    assert load_book(state).rate(tier, "aws", "g6e.xlarge", "L40S", 1).value == pytest.approx(1.1)
    assert load_book(state, trainer="builtin").rate(tier, "aws", "g6e.xlarge", "L40S", 1) is None
    assert load_book(state, trainer="kohya").rate(tier, "aws", "g6e.xlarge", "L40S", 1).value == pytest.approx(1.1)


def test_a_rate_on_one_gpu_is_scaled_to_a_multi_gpu_host():
    tier = get_tier("sdxl-lora")
    book = Book([_recorded("A10G", 1.0)])
    assert book.rate(tier, "aws", "g5.12xlarge", "A10G", 4).value == pytest.approx(4 * 0.81)
    four = Book([_recorded("A10G", 3.24, gpu_count=4)])
    assert four.rate(tier, "aws", "g5.xlarge", "A10G", 1).value == pytest.approx(1.0)


def test_the_newest_recorded_figure_wins_and_a_host_specific_one_first():
    tier = get_tier("sdxl-lora")
    book = Book([_recorded("L40S", 0.9, at=1.0, row_id=1), _recorded("L40S", 1.1, at=2.0, row_id=2),
                 _recorded("L40S", 0.5, provider="aws", instance_type="g6e.xlarge", at=0.5, row_id=3)])
    assert book.rate(tier, "aws", "g6e.2xlarge", "L40S", 1).value == pytest.approx(1.1)
    assert book.rate(tier, "aws", "g6e.xlarge", "L40S", 1).value == pytest.approx(0.5)


def test_offers_warn_in_one_line_where_the_catalog_is_off_from_what_was_observed(capsys, sdcloud_home):
    state = StateStore()
    observe(state, "r-1", 1, 0.7)
    observe(state, "r-2", 1, 0.8)
    state.close()
    rows = offers_json(capsys, "--tier", "sdxl-lora")
    err = capsys.readouterr().err
    code, _, err = run_cli(capsys, "offers", "--tier", "sdxl-lora", "--limit", "3")
    lines = [line for line in err.splitlines() if "observed in 2 runs" in line]
    assert code == 0 and len(lines) == 1
    assert "L40S" in lines[0] and "above" in lines[0]
    assert all(r["rate_source"] == "observed: 2 runs" for r in rows if r["gpu"] == "L40S")
    # Within 25%: no warning.
    state = StateStore()
    records.forget(state, gpu="L40S")
    observe(state, "r-3", 1, gpu_rate(get_tier("sdxl-lora"), "L40S") * 0.9)
    _, _, err = run_cli(capsys, "offers", "--tier", "sdxl-lora", "--limit", "3")
    assert "observed in" not in err


def test_the_deadline_check_before_launch_uses_the_recorded_rate(capsys, sdcloud_home):
    # At the catalog's rates 3000 sdxl-lora steps fit in 1 h; at 0.05 steps/s a GPU (8 GPUs: 0.29) they do not.
    args = ["up", "--tier", "sdxl-lora", "--provider", "aws", "--deadline", "1h", "--yes"]
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and "shorter than" not in err  # past the estimates, refused later (no credentials here)
    state = StateStore()
    for gpu in ("T4", "V100", "V100-32GB", "A10G", "L4", "L40S", "A100", "A100-80GB", "H100"):
        records.add_recorded(state, gpu, "sdxl-lora", 0.05)
    state.close()
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and "shorter than the fastest estimate" in err


# -- every run teaches -----------------------------------------------------------------------------------
def _attempt(n: int, start: float, end: float, reason: str, zone: str = "us-east-1a", market: str = "spot"):
    return SimpleNamespace(n=n, start=start, end=end, end_reason=reason, provider="aws", instance_type="g6e.xlarge",
                           zone=zone, market=market, hours=(end - start) / 3600)


def test_an_attempt_keeps_its_steady_rate_start_up_and_reclaim(sdcloud_home, tmp_path):
    state = StateStore()
    state.create_run("r-1", "sdxl-lora", {"tier": "sdxl-lora"}, 100)
    t0 = 1_800_000_000.0
    state.add_attempt("r-1", 1, "aws", "tok1", start=t0, end=t0 + 3600, end_reason="preempted", state="ended")
    state.add_attempt("r-1", 2, "aws", "tok2", start=t0 + 3700, end=t0 + 7200, end_reason="succeeded", state="ended")
    state.set_attempt_costs("r-1", 1, first_step_at=t0 + 300, start_step=1, last_step=60, last_step_at=t0 + 3500,
                            it_per_s=1.25)
    state.set_attempt_costs("r-1", 2, first_step_at=t0 + 3700 + 240, start_step=55, last_step=100,
                            last_step_at=t0 + 7100)

    class Store:
        def get(self, key):
            assert key == "runs/r-1/boot/attempt-2.json"
            return json.dumps({"phases": [{"name": "environment", "seconds": 80.0}, {"name": "model", "seconds": 95.5},
                                          {"name": "first-step", "seconds": 230.0}]}).encode()

    kw = dict(tier="sdxl-lora", gpu="L40S", gpu_count=1, trainer="builtin", recipe="")
    first = learn(state, "r-1", _attempt(1, t0, t0 + 3600, "preempted"), **kw)
    second = learn(state, "r-1", _attempt(2, t0 + 3700, t0 + 7200, "succeeded"), store=Store(), **kw)
    assert first["rate"] == 1.25 and first["first_step_s"] == 300 and first["restart_s"] is None and first["reclaimed"]
    # No it/s reported: steps over time since the first step.
    assert second["rate"] == pytest.approx(45 / (7100 - 3940))
    assert second["first_step_s"] == 240 and second["restart_s"] == 240 and not second["reclaimed"]
    assert second["phases"] == {"environment": 80.0, "model": 95.5, "first-step": 230.0}
    stored = records.rows(state)
    assert [r.n for r in stored] == [1, 2] and stored[1].phases["model"] == 95.5
    assert records.reclaims_per_hour(stored) == {"aws/us-east-1a": pytest.approx(1 / (1 + 3500 / 3600))}


def test_an_attempt_not_yet_warm_has_no_rate():
    assert steady_rate({}) is None
    assert steady_rate({"start_step": 5, "last_step": 7, "it_per_s": 3.0, "first_step_at": 1, "last_step_at": 2}) is None
    assert steady_rate({"start_step": 5, "last_step": 8, "it_per_s": 3.0}) == 3.0


@pytest.mark.slow
def test_a_finished_local_run_lists_its_measured_rate(sdcloud_home):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "sdcloud.cli", "up", "--provider", "local", "--tier", "sd15-lora",
                           "--model", "tiny", "--steps", "12", "--yes", "--json"], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads(proc.stdout)["run"]
    listed = subprocess.run([sys.executable, "-m", "sdcloud.cli", "speeds", "--json"], capture_output=True, text=True,
                            timeout=120, env=env)
    assert listed.returncode == 0, listed.stderr
    got = [s for s in json.loads(listed.stdout) if s["tier"] == "sd15-lora" and s["origin"] == "observed"]
    assert len(got) == 1 and got[0]["runs"] >= 1 and got[0]["rate"] > 0
    assert got[0]["provider"] == "local" and got[0]["trainer"] == "builtin" and got[0]["recipe"] == "tiny"
    assert got[0]["first_step_s"] is not None and got[0]["last_seen"] <= time.time()
    exported = json.loads(subprocess.run([sys.executable, "-m", "sdcloud.cli", "speeds", "export"], capture_output=True,
                                         text=True, timeout=120, env=env).stdout)
    assert {r["run_id"] for r in exported["rows"]} == {run}


def test_speeds_lists_one_gpu_or_tier_and_knows_gpus_runs_were_seen_on(capsys, sdcloud_home):
    state = StateStore()
    observe(state, "r-1", 1, 3.0, gpu="CPU", provider="local", instance_type="this-machine", tier="sd15-lora",
            recipe="tiny")
    observe(state, "r-2", 1, 1.2)
    code, out, _ = run_cli(capsys, "speeds", "--json", "--gpu", "cpu")
    assert code == 0 and [s["gpu"] for s in json.loads(out)] == ["CPU"]
    code, out, _ = run_cli(capsys, "speeds", "--json", "--tier", "sdxl-lora")
    assert code == 0 and [(s["gpu"], s["runs"]) for s in json.loads(out)] == [("L40S", 1)]
    code, _, err = run_cli(capsys, "speeds", "--gpu", "Z80")
    assert code == 2 and "unknown GPU 'Z80'" in err
