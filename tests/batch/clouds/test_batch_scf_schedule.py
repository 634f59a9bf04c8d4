"""`sdcloud batch schedule add --provider tencent`: an SCF timer trigger on the stack's cloud driver,
made through the SDK against the SCF fake (tests/support/fake_tencent_api.py: TC3 signing with service `scf`,
version 2018-04-16, SCF's seven-field timer cron); the handler called as the timer calls it (the
trigger's own custom argument as `Message`, two deliveries racing) submits the job once and the
driver's ticks finish it. The job's bucket is a folder here: COS has its own tests."""

from __future__ import annotations

import json
import threading

import pytest

from sdcloud.errors import UserError

from tests.support import fake_tencent_api
from tests.batch.clouds.test_batch_cloud import RecordingCloud

INFRA = {"bucket": "sd-1250000000", "region": "ap-guangzhou", "driver_function": "sdcloud-test-driver"}


@pytest.fixture
def scf(monkeypatch, tmp_path, sdcloud_home):
    from sdcloud.runs.records.state import StateStore

    bucket = tmp_path / "bucket"
    bucket.mkdir()
    with fake_tencent_api.ScfServer() as srv:
        srv.scf.add_function("sdcloud-test-driver", "ap-guangzhou")
        monkeypatch.setenv("SDCLOUD_TENCENT_ENDPOINT", srv.endpoint)
        monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", fake_tencent_api.SECRET_ID)
        monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", fake_tencent_api.SECRET_KEY)
        StateStore().save_infra("tencent", "", INFRA)
        monkeypatch.setattr("sdcloud.batch.submit.store_conf", lambda provider, store, region=None: {"url": bucket.as_uri()})
        yield srv, bucket


def _add(tmp_path, *extra: str) -> int:
    from sdcloud.cli import main

    p = tmp_path / "prompts.txt"
    p.write_text("a red fox in snow\na blue heron at dawn\nan old tram in rain\n")
    return main(["batch", "schedule", "add", "--provider", "tencent", "--tier", "batch-sd15", "--model", "tiny",
                 "--prompts", str(p), "--workers", "2", "--generator", "fake", *extra])


def test_a_tencent_schedule_is_an_scf_timer_that_submits_its_job_once(scf, tmp_path, monkeypatch, capsys, sdcloud_home):
    from sdcloud.cli import main
    from sdcloud.driver import unattended

    srv, bucket = scf
    assert _add(tmp_path, "--cron", "30 2 * * 1-7") == 0
    sid = capsys.readouterr().out.strip()
    [trigger] = srv.scf.functions[("ap-guangzhou", "default", "sdcloud-test-driver")]
    assert trigger["TriggerName"] == f"sdcloud-batch-{sid}" and trigger["Type"] == "timer"
    assert json.loads(trigger["TriggerDesc"]) == {"cron": "0 30 2 * * 1-6,0 *"}  # seconds first, Sunday is 0
    assert main(["batch", "schedule", "list", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["id"] == sid and row["tz"] == "Asia/Shanghai" and row["cron"] == "0 30 2 * * 1-6,0 *"

    # The laptop is gone; the timer fires at 02:30 Beijing time (18:30 UTC the day before), delivered twice.
    cloud = RecordingCloud("tencent")
    monkeypatch.setattr("sdcloud.providers.get_provider", lambda name, **kw: cloud)
    monkeypatch.setenv("SDCLOUD_STORE", bucket.as_uri())
    monkeypatch.setenv("SDCLOUD_DRIVER_SECONDS", "1")
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "function"))
    event = {"Type": "Timer", "TriggerName": trigger["TriggerName"], "Time": "2026-12-06T18:30:00Z",
             "Message": trigger["CustomArgument"]}
    got: list[dict] = []
    threads = [threading.Thread(target=lambda: got.append(unattended.main_handler(event, {"time_limit_in_ms": 60_000})))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    fired = [r["batch"]["fired"] for r in got]
    assert len({f["job"] for f in fired}) == 1 and sum("submitted" in f for f in fired) == 1, fired
    assert fired[0]["wall"] == "2026-12-07T02:30"
    job = fired[0]["job"]
    assert len(cloud.live()) == 2, "the fire's step launched the job's two hosts"
    # The workers finish every item; the driver's own timer tick then ends the hosts and the job.
    from sdcloud_agent.batch import layout
    from sdcloud_agent.store import LocalStore

    store = LocalStore(bucket)
    for line in store.get(f"batch/{job}/items.jsonl").decode().splitlines():
        item = json.loads(line)["id"]
        store.put_if_absent(layout.done_key(f"batch/{job}", item), json.dumps({"item": item, "images": []}).encode())
    tick = {"Type": "Timer", "TriggerName": "sdcloud-driver", "Time": "2026-12-06T18:35:00Z", "Message": ""}
    assert unattended.main_handler(tick, {"time_limit_in_ms": 60_000})["batch"]["jobs"][job]["state"] == "succeeded"
    assert cloud.live() == [] and store.list("drivers/batch/") == []
    assert [o.key for o in store.list("batch/") if o.key.endswith("/job.json")] == [f"batch/{job}/job.json"]

    monkeypatch.setenv("SDCLOUD_HOME", str(sdcloud_home))
    assert main(["batch", "schedule", "remove", sid]) == 0
    assert f"SCF timer trigger sdcloud-batch-{sid}" in capsys.readouterr().out
    assert srv.scf.functions[("ap-guangzhou", "default", "sdcloud-test-driver")] == []
    assert main(["batch", "schedule", "remove", sid]) == 2


def test_a_tencent_schedule_pauses_and_resumes_its_timer(scf, tmp_path, capsys):
    from sdcloud.cli import main

    srv, _ = scf
    assert _add(tmp_path, "--cron", "0 4 * * *") == 0
    sid = capsys.readouterr().out.strip()
    [trigger] = srv.scf.functions[("ap-guangzhou", "default", "sdcloud-test-driver")]
    assert trigger["Enable"] == 1

    assert main(["batch", "schedule", "pause", sid]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"paused {sid}") and f"SCF timer trigger sdcloud-batch-{sid} on tencent" in out, out
    assert trigger["Enable"] == 0
    [call] = [c["params"] for c in srv.scf.calls if c["action"] == "UpdateTriggerStatus"]
    assert call == {"FunctionName": "sdcloud-test-driver", "Namespace": "default", "TriggerName": f"sdcloud-batch-{sid}",
                    "Type": "timer", "Enable": "CLOSE"}
    assert main(["batch", "schedule", "list", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["paused"] is True and row["cron"] == "0 0 4 * * * *"
    assert main(["batch", "schedule", "pause", sid]) == 0
    assert "was already paused; nothing changed" in capsys.readouterr().out
    assert sum(c["action"] == "UpdateTriggerStatus" for c in srv.scf.calls) == 1

    assert main(["batch", "schedule", "resume", sid]) == 0
    assert capsys.readouterr().out.startswith(f"resumed {sid}")
    assert trigger["Enable"] == 1
    assert main(["batch", "schedule", "resume", "s-nosuch1"]) == 2
    assert "no schedule 's-nosuch1'" in capsys.readouterr().err


def test_tencent_schedules_refuse_what_scf_cannot_take(scf, tmp_path, capsys):
    from sdcloud.providers.tencent import schedules

    srv, _ = scf
    # SCF timers know one zone, UTC+8: another is refused before anything is made.
    assert _add(tmp_path, "--cron", "0 2 * * *", "--tz", "Europe/Berlin") == 2
    err = capsys.readouterr().err
    assert "UTC+8" in err and len(err.strip().splitlines()) == 1
    assert srv.scf.functions[("ap-guangzhou", "default", "sdcloud-test-driver")] == []
    # The fake refuses what SCF refuses: a five-field cron, a second trigger of one name, a missing function.
    with pytest.raises(UserError, match="InvalidParameterValue.TriggerDesc"):
        schedules.create("sdcloud-batch-x", "0 2 * * *", "Asia/Shanghai", {"schedule": "x"}, INFRA)
    with pytest.raises(UserError, match="InvalidParameterValue.TriggerDesc"):
        schedules.create("sdcloud-batch-x", "0 0 25 * * * *", "Asia/Shanghai", {"schedule": "x"}, INFRA)
    schedules.create("sdcloud-batch-x", "0 0 2 * * MON-FRI *", "Asia/Shanghai", {"schedule": "x"}, INFRA)
    with pytest.raises(UserError, match="ResourceInUse.Trigger"):
        schedules.create("sdcloud-batch-x", "0 0 3 * * * *", "Asia/Shanghai", {"schedule": "x"}, INFRA)
    with pytest.raises(UserError, match="ResourceNotFound.Function"):
        schedules.create("sdcloud-batch-y", "0 0 3 * * * *", "Asia/Shanghai", {"schedule": "y"},
                         {**INFRA, "driver_function": "nope"})
    assert schedules.set_enabled("sdcloud-batch-y", False, INFRA) is None  # no such timer: nothing to change
    assert schedules.delete("sdcloud-batch-x", INFRA) is True and schedules.delete("sdcloud-batch-x", INFRA) is False
