"""Every command survives every state the store can hold, for both kinds of row.

The runs table is one union of training runs and batch jobs (docs/architecture.md). This test
writes rows of both kinds in every state the code writes (pending, launching, running,
recovering, stopped, failed, succeeded, cancelled), plus zombies (an active row whose controller
is dead) and rows with a live controller, then drives every command against each row and asserts:
exit 0, or a one-line error with exit 2 or 4 (watch also exits 1 for a run that ended without
succeeding, as docs/runs.md documents), never a traceback, and no changed row except where the
command's purpose is to change it. No host trains here: `resume` is checked up to the driver.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from sdcloud.cli import main

TRAIN_STATES = ("pending", "launching", "running", "recovering", "stopped", "failed", "succeeded")
BATCH_STATES = ("pending", "running", "stopped", "failed", "succeeded", "cancelled")
ACTIVE = ("pending", "launching", "running", "recovering")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _live_controller() -> subprocess.Popen:
    # A process whose command line names sdcloud, as a real controller's does (controller_alive reads it).
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "sdcloud-controller"])


@pytest.fixture
def world(tmp_path, monkeypatch):
    """Rows of both kinds in every state; returns {label: row id} and the live controllers."""
    from sdcloud.batch import jobs
    from sdcloud.runs.inputs.spec import build_spec
    from sdcloud.runs.records.state import StateStore

    monkeypatch.chdir(tmp_path)
    # The stand-in controllers below never see a cancel; a real driver stops within one poll.
    monkeypatch.setattr(jobs, "DRIVER_STOP_SECONDS", 0.5)
    state = StateStore()
    rows: dict[str, str] = {}
    live: dict[str, subprocess.Popen] = {}
    spec = build_spec(None, {"tier": "sd15-lora", "provider": "local", "model": "tiny", "steps": 4}).as_dict()
    for st in TRAIN_STATES:
        rid = f"r-{len(rows):08x}"
        state.create_run(rid, "sd15-lora", spec, 4, name=f"train-{st}")
        state.update_run(rid, state=st, step=2 if st != "pending" else 0)
        if st != "pending":
            open_ = st in ACTIVE
            state.add_attempt(rid, 1, "local", "tok", region="local", zone="local", instance_type="cpu",
                              market="on-demand", price=0.0, currency="USD", instance_id=f"local-{rid}",
                              start=time.time() - 60, end=None if open_ else time.time() - 1)
            if not open_:
                state.update_attempt(rid, 1, state="ended", end_reason=st)
        rows[f"train-{st}"] = rid
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cup\na blue vase\n")
    for st in BATCH_STATES:
        res = jobs.submit(jobs.SubmitOptions(tier="batch-sd15", model="tiny", prompts=str(prompts),
                                             generator="fake", name=f"batch-{st}"))
        state.update_run(res["job"], state=st)
        rows[f"batch-{st}"] = res["job"]
    # Zombies: active rows whose controller died without a word.
    for kind, label in (("train", "train-running"), ("batch", "batch-running")):
        state.update_run(rows[label], controller_pid=_dead_pid())
    # Live controllers: an active row that something still drives.
    for label in ("train-launching", "batch-pending"):
        proc = _live_controller()
        live[label] = proc
        state.update_run(rows[label], controller_pid=proc.pid)
    yield rows, live
    for proc in live.values():
        proc.kill()
        proc.wait()


def snapshot() -> dict:
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    return {r["id"]: (r["state"], r["step"], json.dumps(r["spec"], sort_keys=True),
                      [(a.n, a.state, a.end_reason) for a in state.attempts(r["id"])])
            for r in state.list_runs()}


def call(capsys, *args: str) -> tuple[int, str, str]:
    try:
        rc = main(list(args))
    except SystemExit as exc:  # watch ends with the run's own exit code
        rc = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return rc, out.out, out.err


def check_exit(rc: int, err: str, what: str, allowed=(0, 2, 4)) -> None:
    assert "Traceback" not in err, f"{what}: traceback\n{err}"
    assert rc in allowed, f"{what}: exit {rc}\n{err}"
    if rc in (2, 4):
        # watch's progress view writes its "[hh:mm:ss] ..." lines to stderr; the reason is one line after them
        lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("[")]
        assert len(lines) == 1, f"{what}: exit {rc} with {len(lines)} stderr lines:\n{err}"


READ_ONLY = (
    ("status", "{id}"), ("status", "{id}", "--json"), ("logs", "{id}"), ("logs", "{id}", "--tail", "1"),
    ("logs", "{id}", "--json"), ("cost", "report", "{id}"), ("cost", "report", "{id}", "--format", "json"),
    ("batch", "status", "{id}"), ("batch", "status", "{id}", "--json"), ("batch", "verify", "{id}"),
    ("batch", "pull", "{id}", "{dest}"),
)


def test_read_only_commands_survive_every_row_and_change_nothing(world, capsys, tmp_path):
    world, live = world
    before = snapshot()
    for args in (("status",), ("status", "--json"), ("cost", "report", "--all"), ("batch", "list"),
                 ("batch", "list", "--json"), ("cost", "report", "--all", "--format", "csv")):
        rc, out, err = call(capsys, *args)
        check_exit(rc, err, " ".join(args), allowed=(0,))
    rc, out, _ = call(capsys, "status", "--json")
    listed = {r["run"]: r for r in json.loads(out)}
    assert set(listed) == set(world.values()), "status lists every row of both kinds"
    assert {r["kind"] for r in listed.values()} == {"train", "batch"}
    assert listed[world["batch-running"]]["controller"] == "none"
    assert listed[world["batch-pending"]]["controller"] == "ok"
    for label, rid in world.items():
        for template in READ_ONLY:
            args = [a.format(id=rid, dest=tmp_path / "batch-pulls" / label) for a in template]
            rc, out, err = call(capsys, *args)
            # batch verify: 1 is FAILED (a succeeded row here has no images), 2 incomplete (docs/batch.md)
            check_exit(rc, err, f"{' '.join(args)} ({label})",
                       allowed=(0, 1, 2, 4) if template[:2] == ("batch", "verify") else (0, 2, 4))
            if template[0] == "batch" and label.startswith("train"):
                assert rc == 2, f"{args}: a training run is not a batch job"
            elif template[0] in ("status", "logs", "cost"):
                assert rc == 0, f"{' '.join(args)} ({label}): exit {rc}\n{err}"
        if label in ("train-launching", "batch-pending"):
            continue  # a live controller: watch would follow it for as long as it lives
        rc, out, err = call(capsys, "watch", rid, "--interval", "0.05")
        state = label.split("-", 1)[1]
        expected = 0 if state == "succeeded" else (4 if state in ACTIVE else 1)
        check_exit(rc, err, f"watch ({label})", allowed=(expected,))
        dest = tmp_path / "pulls" / label
        rc, out, err = call(capsys, "pull", rid, str(dest))
        check_exit(rc, err, f"pull ({label})")
        if label.startswith("batch"):
            assert rc == 0 and (dest / "index.html").exists(), f"pull of a batch job gives its gallery ({label})"
    assert snapshot() == before, "a read-only command changed a row"


@pytest.mark.parametrize("label", [f"train-{s}" for s in TRAIN_STATES] + [f"batch-{s}" for s in BATCH_STATES])
def test_down_ends_each_row_once_and_for_good(world, capsys, label):
    world, live = world
    rid = world[label]
    before = snapshot()
    rc, out, err = call(capsys, "down", rid, "--json")
    check_exit(rc, err, f"down ({label})", allowed=(0,))
    after = snapshot()
    prior = label.split("-", 1)[1]
    now = after[rid][0]
    if prior in ACTIVE:
        assert now == ("cancelled" if label.startswith("batch") else "stopped"), f"down {label} left {now}"
        assert all(a[1] == "ended" for a in after[rid][3]), "down leaves no open attempt"
        if label in ("train-launching", "batch-pending"):
            assert live[label].wait(10) is not None, "down stops the live controller"
    else:
        assert after[rid] == before[rid], f"down changed a row that had already ended ({label})"
    assert {k: v for k, v in after.items() if k != rid} == {k: v for k, v in before.items() if k != rid}
    # Cancel is final: a second down, and a batch driver started afterwards, change nothing.
    rc, out, err = call(capsys, "down", rid)
    check_exit(rc, err, f"second down ({label})", allowed=(0,))
    assert snapshot()[rid] == after[rid]
    if label.startswith("train"):  # said as what it is: nothing was stopped this time
        assert out.startswith(f"run {rid} had already ended: ") and len(out.strip().splitlines()) == 1, out
    if label.startswith("batch"):
        from sdcloud.batch import jobs

        res = jobs.run_job(rid)
        assert res.get("workers_started", 0) == 0, "a driver after a cancel started workers"
        assert snapshot()[rid][0] == after[rid][0]


def test_down_all_stops_both_kinds(world, capsys):
    world, live = world
    rc, out, err = call(capsys, "down", "--all", "--yes", "--json")
    check_exit(rc, err, "down --all", allowed=(0,))
    after = snapshot()
    for label, rid in world.items():
        if label.split("-", 1)[1] in ACTIVE:
            assert after[rid][0] in ("stopped", "cancelled"), f"{label}: {after[rid][0]}"
    rc, out, err = call(capsys, "status")
    check_exit(rc, err, "status after down --all", allowed=(0,))
    assert "no controller" not in out


@pytest.mark.parametrize("label", [f"train-{s}" for s in TRAIN_STATES] + [f"batch-{s}" for s in BATCH_STATES])
def test_resume_and_batch_cancel_on_each_row(world, capsys, monkeypatch, label):
    world, live = world
    import sdcloud.batch.jobs as jobs
    import sdcloud.commands.run as run_cmd

    driven: list[str] = []
    monkeypatch.setattr(run_cmd, "drive", lambda state, run_id, detach, as_json: driven.append(run_id))
    monkeypatch.setattr(jobs, "run_job", lambda job_id, on_progress=None: driven.append(job_id)
                        or {"job": job_id, "images_done": 0, "images": 2})
    rid = world[label]
    prior = label.split("-", 1)[1]
    before = snapshot()
    rc, out, err = call(capsys, "resume", rid)
    check_exit(rc, err, f"resume ({label})")
    live = label in ("train-launching", "batch-pending")
    if label.startswith("train"):
        should_drive = prior in ("stopped", "failed") or (prior in ACTIVE and not live)
    else:
        should_drive = prior in ACTIVE and not live
    assert driven == ([rid] if should_drive else []), f"resume {label}: drove {driven}, exit {rc}: {err}"
    if not should_drive:
        assert rc == 2 and snapshot() == before
    rc, out, err = call(capsys, "batch", "cancel", rid)
    check_exit(rc, err, f"batch cancel ({label})")
    if label.startswith("train"):
        assert rc == 2
    else:
        assert rc == 0
        assert snapshot()[rid][0] == ("cancelled" if prior in ACTIVE else prior)


def test_cancel_by_name_stops_the_pool_and_nothing_restarts(tmp_path, monkeypatch):
    """The bug as users met it: `batch cancel NAME` wrote by name, matched no row, and the pool kept
    relaunching workers every few seconds with the job `running`."""
    import threading

    from sdcloud.batch import jobs
    from sdcloud.runs.records.state import StateStore

    prompts = tmp_path / "p.txt"
    prompts.write_text("".join(f"item {i}\n" for i in range(40)))
    res = jobs.submit(jobs.SubmitOptions(tier="batch-sd15", model="tiny", prompts=str(prompts), generator="fake",
                                         fake_delay=0.5, workers=2, name="gal"))
    job = res["job"]
    out: dict = {}
    driver = threading.Thread(target=lambda: out.update(jobs.run_job(job)), daemon=True)
    driver.start()
    state = StateStore()
    until = time.time() + 60
    while time.time() < until and not any(e["kind"] == "worker-started" for e in state.events(job)):
        time.sleep(0.1)
    assert jobs.cancel("gal")["state"] == "cancelled"
    driver.join(30)
    assert not driver.is_alive(), "the pool kept running after the cancel"
    starts = sum(1 for e in state.events(job) if e["kind"] == "worker-started")
    time.sleep(3)
    assert sum(1 for e in state.events(job) if e["kind"] == "worker-started") == starts
    assert state.get_run(job)["state"] == "cancelled"
    assert out["workers_started"] <= 2 and out["images_done"] < out["images"]


def test_logs_of_a_local_batch_job_show_its_workers(tmp_path, capsys):
    from sdcloud.batch import jobs

    prompts = tmp_path / "p.txt"
    prompts.write_text("a cup\na vase\n")
    job = jobs.submit(jobs.SubmitOptions(tier="batch-sd15", model="tiny", prompts=str(prompts), generator="fake",
                                         workers=1))["job"]
    jobs.run_job(job)
    rc, out, err = call(capsys, "logs", job, "--json")
    assert rc == 0, err
    sources = {json.loads(ln)["source"] for ln in out.splitlines() if ln.strip()}
    assert "controller" in sources and "worker-1" in sources, sources


@pytest.mark.parametrize("damage", [b"garbage\n", b"SQLite format 3\x00" + b"\x00" * 80])
def test_a_state_file_that_is_not_a_database_is_said_in_one_line_by_every_command(capsys, sdcloud_home, damage):
    """A state.db damaged or replaced by something else (a copy cut short, a stray file): every command
    that reads it says which file and what to do, in one line, exit 2; none launches anything."""
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "state.db").write_bytes(damage)
    for args in (["status"], ["status", "r-00000000"], ["logs", "r-00000000"], ["cost", "report"], ["batch", "list"],
                 ["down", "--all", "--yes"], ["gc", "--provider", "local", "--yes"], ["speeds"],
                 ["speeds", "add", "--gpu", "L40S", "--tier", "sdxl-lora", "--rate", "1"], ["offers", "--tier", "sd15-lora"],
                 ["up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "2", "--yes"]):
        rc, out, err = call(capsys, *args)
        assert rc == 2 and len(err.strip().splitlines()) == 1, (args, rc, err)
        assert "state.db is not a state store sdcloud can read" in err and "move it aside" in err, (args, err)
    assert (sdcloud_home / "state.db").read_bytes() == damage, "the damaged file is left as it was, for the user"


def test_a_home_or_state_path_that_cannot_be_used_is_said_in_one_line(capsys, tmp_path, monkeypatch):
    # SDCLOUD_HOME naming a file, and a state.db that is a folder: one line naming the path, exit 2.
    afile = tmp_path / "not-a-folder"
    afile.write_text("x")
    monkeypatch.setenv("SDCLOUD_HOME", str(afile))
    rc, out, err = call(capsys, "status")
    assert rc == 2 and err.strip() == (f"error: sdcloud's home {afile} cannot be used (it is a file): set SDCLOUD_HOME "
                                       "to a folder sdcloud may write"), err
    home = tmp_path / "home"
    (home / "state.db").mkdir(parents=True)
    monkeypatch.setenv("SDCLOUD_HOME", str(home))
    rc, out, err = call(capsys, "cost", "report")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and f"{home / 'state.db'} is not a state store" in err, err
