"""SCF timers at first contact (issue 46): the timer event is taken in any case (`Timer` and `timer`
both appear in Tencent's documents); a cron in the user's zone becomes SCF's seven-field cron in UTC+8,
the zone sdcloud assumes and says so at `schedule add`; and a schedule's fire runs under each cloud
function's own Python with no zone database on the machine (the package carries tzdata)."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile

import pytest
from tests.batch.clouds.test_batch_scf_schedule import _add, scf  # noqa: F401 - the SCF fake and the CLI's schedule add

from tests.support.harness_interpreters import python_for
from sdcloud.errors import UserError


@pytest.mark.parametrize("kind", ["Timer", "timer", "TIMER"])
def test_the_timer_event_is_taken_in_any_case(kind):
    from sdcloud.batch.schedule_keys import FIRE, fire_of
    from sdcloud.driver.unattended import _driver_name

    event = {"Type": kind, "TriggerName": "sdcloud-batch-s-1", "Time": "2026-12-06T18:30:00Z",
             "Message": json.dumps({"sdcloud": FIRE, "schedule": "s-1"})}
    assert fire_of(event) == {"schedule": "s-1", "time": "2026-12-06T18:30:00Z"}
    assert _driver_name(event) == "tencent-scf"


@pytest.mark.parametrize("cron, tz, scf_cron", [
    ("0 2 * * *", "Asia/Shanghai", "0 0 2 * * * *"),       # UTC+8 itself: as given
    ("0 2 * * *", "UTC", "0 0 10 * * * *"),                 # 02:00 UTC is 10:00 in UTC+8
    ("30 9 * * 1-5", "Asia/Tokyo", "0 30 8 * * 1-5 *"),     # UTC+9: an hour back, same days
    ("0 20 * * MON", "UTC", "0 0 4 * * 2 *"),               # Monday 20:00 UTC is Tuesday 04:00 in UTC+8
    ("0 2 * * *", "Asia/Kolkata", "0 30 4 * * * *"),        # UTC+5:30: the minutes move too
    ("*/15 * * * *", "UTC", "0 */15 * * * * *"),            # every quarter hour, whatever the zone
    ("0 2 1 * *", "UTC", "0 0 10 1 * * *"),                 # the day of month stays: no midnight crossed
])
def test_a_cron_in_the_user_s_zone_becomes_scf_s_cron_in_utc8(cron, tz, scf_cron):
    from sdcloud.providers.tencent.schedules import expression

    assert expression(cron, tz) == scf_cron


@pytest.mark.parametrize("cron, tz, needle", [
    ("0 2 * * *", "Europe/Berlin", "changes its UTC offset"),   # summer time: no one fixed cron follows it
    ("0 20 1 * *", "UTC", "crosses midnight"),                    # the 1st at 20:00 UTC is the 2nd in UTC+8
    ("0 1,20 * * 1", "UTC", "crosses midnight"),                  # two days of the week from one
])
def test_what_one_scf_cron_cannot_say_is_one_line(cron, tz, needle):
    from sdcloud.providers.tencent.schedules import expression

    with pytest.raises(UserError, match=needle):
        expression(cron, tz)


def test_schedule_add_says_the_zone_is_assumed_and_what_the_cron_became(scf, tmp_path, capsys):  # noqa: F811
    srv, _ = scf
    assert _add(tmp_path, "--cron", "0 2 * * *", "--tz", "UTC") == 0
    err = capsys.readouterr().err
    assert "warning: SCF timers are assumed to fire in UTC+8" in err and "583/9708" in err, err
    assert "0 2 * * * in UTC is 0 0 10 * * * * there" in err
    [trigger] = srv.scf.functions[("ap-guangzhou", "default", "sdcloud-test-driver")]
    assert json.loads(trigger["TriggerDesc"]) == {"cron": "0 0 10 * * * *"}


# A schedule's fire from the package alone, under the function's Python, with no zone files: the
# schedule's zone is read from the package's tzdata.
FIRE = r"""
import json, sys
import sdcloud_driver  # SCF's entry: on its 3.10 it gives the names of 3.11 the control plane uses
from sdcloud.driver.batch_jobs import fire
from sdcloud_agent.store import LocalStore
print(json.dumps(fire(LocalStore(sys.argv[1]), sys.argv[2], "2026-12-06T18:30:00Z", "probe:1")))
"""


@pytest.fixture(scope="module")
def package_dir(tmp_path_factory):
    from sdcloud.infra import function_package as fp

    where = tmp_path_factory.mktemp("fn")
    with zipfile.ZipFile(fp.current().write(where / "zip")) as zf:
        zf.extractall(where / "task")
    return where / "task"


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted({f.python for f in __import__("sdcloud.infra.function_package",
                                                                          fromlist=["runtimes"]).runtimes()}))
def test_a_schedule_fire_runs_under_each_function_s_python_without_zone_files(scf, tmp_path, capsys,  # noqa: F811
                                                                              package_dir, version):
    _, bucket = scf
    assert _add(tmp_path, "--cron", "30 9 * * *", "--tz", "Asia/Tokyo") == 0
    sid = capsys.readouterr().out.strip()
    python = python_for(version, "a cloud function's Python")
    empty = tmp_path / "no-zones"
    empty.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(package_dir), "HOME": str(tmp_path),
           "SDCLOUD_HOME": str(tmp_path / "fn-tmp"), "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONTZPATH": "", "TZDIR": str(empty), "TZ": "UTC"}  # no zone database but the package's
    run = subprocess.run([python, "-S", "-c", "import zoneinfo; print(zoneinfo.TZPATH)"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "()", "the system's zone files are hidden"
    run = subprocess.run([python, "-S", "-c", FIRE, str(bucket), sid], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["wall"] == "2026-12-07T03:30", out  # 18:30 UTC is 03:30 the next day in Tokyo
    assert "submitted" in out, out
