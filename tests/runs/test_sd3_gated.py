"""Gated models (SD3 / SD3.5): the user's Hugging Face token, from the environment or config.toml, is
checked against the model's gate before launch (answered by a local hub with the hub's recorded
gate answers, tests/support/fake_hub.py), reaches the host through the run's bucket only, and serves the
model fetch there; it is written to no agent config, user-data, state row, event or log."""

from __future__ import annotations

import json
import sqlite3

import pytest

from sdcloud.cli import main

from tests.support.fake_hub import FakeHub
from tests.support.fake_mainland import tiny_hub_repo
from tests.support.fake_sd3_model import tiny_folder

REPO = "stabilityai/stable-diffusion-3.5-medium"
ACCEPTED, NOT_ACCEPTED = "hf_accepted0000000000000000000000", "hf_notaccepted000000000000000000"


@pytest.fixture(scope="module")
def hub():
    with FakeHub({REPO: tiny_hub_repo(tiny_folder())}, gated={REPO: {ACCEPTED}}, tokens={NOT_ACCEPTED}) as h:
        yield h


@pytest.fixture
def gate_env(hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
    # huggingface_hub reads HF_ENDPOINT when imported: an in-process fetch is pointed at the hub here.
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return monkeypatch


def _up(capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["up", "--provider", "local", "--tier", "sd35m-lora", "--model", REPO, "--yes", *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("token, needle", [
    (None, "is gated on the Hugging Face hub and no token is set"),
    (NOT_ACCEPTED, "has not accepted its licence: accept it at https://huggingface.co/" + REPO),
    ("hf_revoked000000000000000000000000", "refuses your token (HTTP 401)"),
])
def test_the_gate_refuses_before_launch_with_one_line(capsys, sdcloud_home, gate_env, token, needle):
    if token:
        gate_env.setenv("HF_TOKEN", token)
    code, err = _up(capsys)
    assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert token is None or token not in err
    assert not (sdcloud_home / "local" / "hosts").exists()
    db = sdcloud_home / "state.db"
    assert not db.exists() or not sqlite3.connect(db).execute("SELECT count(*) FROM runs").fetchone()[0]


def test_an_accepted_token_from_config_toml_passes_the_gate(sdcloud_home, gate_env):
    from sdcloud.offers.tiers import get_tier
    from sdcloud.runs.inputs import hub_access
    from sdcloud.runs.inputs.training import check_model_family

    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text(f'[huggingface]\ntoken = "{ACCEPTED}"\n')
    assert hub_access.token() == ACCEPTED
    assert check_model_family(REPO, get_tier("sd35m-lora")) == "sd3"
    gate_env.setenv("HF_TOKEN", NOT_ACCEPTED)  # the environment wins over config.toml
    with pytest.raises(Exception, match="has not accepted"):
        check_model_family(REPO, get_tier("sd35m-lora"))


def test_the_host_fetches_the_gated_model_with_the_token_from_the_runs_bucket(tmp_path, hub, gate_env):
    from sdcloud_agent import models
    from sdcloud_agent.store import open_store

    store = open_store({"url": (tmp_path / "bucket").as_uri()})
    # Without the token the hub's gate stops the fetch.
    assert models.hub_token(store, "runs/r-gated01") is None
    with pytest.raises(Exception, match="GatedRepo|restricted|401"):
        models.stage(REPO, store, tmp_path / "host-a")
    # The controller's put, then the host's read: the fetch passes, and the token is on no disk of the host.
    from sdcloud.runs.inputs.hub_access import put_for_host

    gate_env.setenv("HF_TOKEN", ACCEPTED)
    assert put_for_host(store, "r-gated01")
    gate_env.delenv("HF_TOKEN")
    token = models.hub_token(store, "runs/r-gated01")
    assert token == ACCEPTED
    path, how = models.stage(REPO, store, tmp_path / "host-b", hub_token=token)
    assert how == "fetched" and models_family(path) == "sd3"
    written = [p for p in (tmp_path / "host-b").rglob("*") if p.is_file()]
    assert written and not [p for p in written if ACCEPTED.encode() in p.read_bytes()]


def models_family(path: str) -> str | None:
    from sdcloud_agent.trainers.models import detect_family

    return detect_family(path)


def test_the_token_travels_in_the_bucket_and_nowhere_else(tmp_path, sdcloud_home, hub, gate_env):
    """The run's staging puts the token at runs/<run>/secrets/hf-token; the agent config, the
    user-data, the state store (runs, attempts, events) and the events hold no trace of it."""
    from tests.fleet.test_fleet import CloudDouble

    from sdcloud.runs.driving.controller import Controller
    from sdcloud.runs.records.state import StateStore
    from sdcloud_agent.store import open_store

    gate_env.setenv("HF_TOKEN", ACCEPTED)
    url = (tmp_path / "bucket").as_uri()
    state = StateStore()
    spec = {"tier": "sd35m-lora", "provider": "aws", "region": "us-east-1", "model": REPO, "steps": 10,
            "market": "spot", "store": url}
    state.create_run("r-gated02", "sd35m-lora", spec, 10)
    events: list = []
    ctl = Controller(state, "r-gated02", provider=CloudDouble(), emit=lambda k, d: events.append((k, d)))
    launch = ctl.launching.launch_spec(1)
    store = open_store({"url": url})
    assert store.get("runs/r-gated02/secrets/hf-token").decode() == ACCEPTED
    assert launch.agent_config["model"] == REPO
    texts = [json.dumps(launch.agent_config), launch.user_data or "", json.dumps(events, default=str)]
    db = sqlite3.connect(state.path)
    texts += [json.dumps(row, default=str) for table in ("runs", "attempts", "events")
              for row in db.execute(f"SELECT * FROM {table}")]
    texts += [o.key + store.get(o.key).decode(errors="replace") for o in store.list("runs/r-gated02/")
              if not o.key.endswith("secrets/hf-token") and o.size < 1_000_000]
    assert not [t for t in texts if ACCEPTED in t], "the token was written where it must never be"


def _gated_run(tmp_path, gate_env, rid: str):
    from tests.fleet.test_fleet import CloudDouble

    from sdcloud.runs.driving.controller import Controller
    from sdcloud.runs.records.state import StateStore
    from sdcloud_agent.store import open_store

    gate_env.setenv("HF_TOKEN", ACCEPTED)
    url = (tmp_path / "bucket").as_uri()
    state = StateStore()
    spec = {"tier": "sd35m-lora", "provider": "aws", "region": "us-east-1", "model": REPO, "steps": 10,
            "market": "spot", "store": url}
    state.create_run(rid, "sd35m-lora", spec, 10)
    ctl = Controller(state, rid, provider=CloudDouble())
    ctl.launching.launch_spec(1)
    return state, ctl, open_store({"url": url})


@pytest.mark.parametrize("end", ["succeeded", "failed", "stopped"])
def test_the_token_ends_with_its_run_in_every_end_state(tmp_path, sdcloud_home, hub, gate_env, end):
    """No secrets/ object is left under a run that has ended, whatever its end."""
    rid = f"r-gated-{end[:4]}"
    state, ctl, store = _gated_run(tmp_path, gate_env, rid)
    assert [o.key for o in store.list(f"runs/{rid}/secrets/")] == [f"runs/{rid}/secrets/hf-token"]
    ctl.end_run(end, None if end == "succeeded" else "the trainer exited 1")
    assert store.list(f"runs/{rid}/secrets/") == [], f"a {end} run left its token in the bucket"
    assert state.get_run(rid)["state"] == end


def test_the_token_object_is_readable_by_its_owner_only(tmp_path, sdcloud_home, hub, gate_env):
    import stat

    _, _, store = _gated_run(tmp_path, gate_env, "r-gated-mode")
    path = tmp_path / "bucket" / "runs" / "r-gated-mode" / "secrets" / "hf-token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    run_dir = tmp_path / "bucket" / "runs" / "r-gated-mode"
    others = [p for p in run_dir.rglob("*") if p.is_file() and "secrets" not in p.parts]
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o044 for p in others), "other objects keep the umask's mode"


def test_a_resumed_run_gets_its_token_back_from_the_driver_that_takes_it_up(tmp_path, sdcloud_home, hub, gate_env):
    from tests.fleet.test_fleet import CloudDouble

    from sdcloud.runs.driving.controller import Controller

    state, ctl, store = _gated_run(tmp_path, gate_env, "r-gated-back")
    ctl.end_run("stopped", "stopped by sdcloud down")
    assert store.list("runs/r-gated-back/secrets/") == []
    state.update_run("r-gated-back", state="recovering")  # taken up again (a resume on another machine)
    again = Controller(state, "r-gated-back", provider=CloudDouble())
    again.ensure_inputs()
    assert store.get("runs/r-gated-back/secrets/hf-token").decode() == ACCEPTED
