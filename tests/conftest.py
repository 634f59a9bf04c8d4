"""Shared fixtures. Every test gets its own $SDCLOUD_HOME; servers are real and on loopback."""

from __future__ import annotations

import os
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.server_seaweed import SeaweedS3, free_port

SHARED = ROOT.parent / "shared"

# One compute thread per process (torch, numpy), for this process and every one a test starts: the
# suite runs several workers, each with trainers and agents of its own, on a few cores, and torch's
# default of a thread per core makes them spin against each other (the tiny models gain nothing
# from more). A value set outside wins.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# The repository root on the path of every process the tests start, as it is on pytest's (its rootdir):
# a helper run as a script (`python tests/support/fake_oom_trainer.py` as an agent's trainer,
# `python -m tests.support.authz.authz_run`) imports `tests.support` as the tests do, with no path edits.
_paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if str(ROOT) not in _paths:
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *_paths])


# -- at another hour (.ci/at-hour; docs/testing.md) --------------------------------------------------

def _faketime_offset() -> float | None:
    """The offset .ci/at-hour moves the clock by (FAKETIME="+Ns"), when it runs the suite."""
    if not os.environ.get("SDCLOUD_FAKETIME_LIB"):
        return None
    match = re.fullmatch(r"\+?(-?\d+(?:\.\d+)?)s", os.environ.get("FAKETIME", ""))
    if match is None:
        raise pytest.UsageError(f"SDCLOUD_FAKETIME_LIB is set but FAKETIME={os.environ.get('FAKETIME')!r} is not an offset "
                                f"like +3600s (.ci/at-hour sets both)")
    return float(match.group(1))


def _at_another_hour(offset: float) -> None:
    """libfaketime goes into the processes the tests start, never into pytest's own: this process is
    already running, so LD_PRELOAD in its environment reaches only its children. Its own clock moves
    in Python by the same offset (time.time, and sdcloud's calendar clock), so that what it stamps
    and what the agents it starts stamp agree."""
    import time as _time

    from sdcloud import clock as sdclock

    os.environ["LD_PRELOAD"] = " ".join(filter(None, [os.environ["SDCLOUD_FAKETIME_LIB"], os.environ.get("LD_PRELOAD")]))
    real_time, real_time_ns = _time.time, _time.time_ns
    _time.time = lambda: real_time() + offset
    _time.time_ns = lambda: real_time_ns() + int(offset * 1e9)
    sdclock.utc_now = lambda: datetime.fromtimestamp(_time.time(), timezone.utc)


# -- parallel workers (pytest-xdist; docs/testing.md) ------------------------------------------------

@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject's addopts): two workers per core. Most of the suite's time is waiting on
    servers, agents and trainers in other processes, so more workers than cores keeps both cores
    busy; SDCLOUD_TEST_WORKERS overrides."""
    if os.environ.get("SDCLOUD_TEST_WORKERS"):
        return int(os.environ["SDCLOUD_TEST_WORKERS"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(2, min(2 * cores, 8))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """The controller's terminal settings, for its workers (see pytest_configure)."""
    node.workerinput["sdcloud_terminal_env"] = {k: os.environ.get(k) for k in ("COLUMNS", "LINES")}


def pytest_configure(config) -> None:
    # At another hour: in each worker, or in this process when it runs the tests itself (-n 0); never
    # in a controller before it starts its workers, which would inherit LD_PRELOAD.
    offset = _faketime_offset()
    if offset is not None and (hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)):
        _at_another_hour(offset)
    # An xdist worker starts with COLUMNS=80 and LINES=24 in its environment (readline, initialised
    # in a process without a terminal, exports them), which the tests' processes inherit: a warning
    # that a pipe keeps on one line would wrap at 80. Workers take the controller's values instead.
    env = getattr(config, "workerinput", {}).get("sdcloud_terminal_env")
    for k, v in (env or {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def pytest_collection_modifyitems(config, items) -> None:
    """Under `--dist loadgroup`, a test file whose tests share a module-scoped fixture (a server, a
    reference training run, a built package) runs on one worker, so the fixture is built once; the
    other tests spread over all workers one by one. A test's own xdist_group mark wins."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if any(d[-1].scope in ("module", "class") for d in defs if d):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if hasattr(item, "module") else item.path.stem))
    if hasattr(config, "workerinput"):
        # Longest first: tests marked slow (and any group holding one) go out to the workers before
        # the quick ones, which then fill the gaps, instead of a long test starting last and running
        # alone at the end. Every worker collects, and sorts, the same way.
        def group(item):
            mark = item.get_closest_marker("xdist_group")
            return (mark.args[0] if mark.args else mark.kwargs.get("name")) if mark else item.nodeid

        slow_groups = {group(item) for item in items if item.get_closest_marker("slow")}
        items.sort(key=lambda item: group(item) not in slow_groups)


@pytest.fixture(scope="session", autouse=True)
def authz_log():
    """SDCLOUD_AUTHZ_LOG=<dir>: every AWS API call this worker's tests make, with the principal that
    makes it in production, one JSON line each (tests/support/authz/authz_record.py; docs/testing.md)."""
    directory = os.environ.get("SDCLOUD_AUTHZ_LOG")
    if not directory:
        yield None
        return
    from tests.support.authz.authz_record import authz_log as sink, install

    with pytest.MonkeyPatch.context() as mp:
        install(sink(directory, os.environ.get("PYTEST_XDIST_WORKER", "main")), mp.setattr)
        yield directory


@pytest.fixture(scope="session")
def lock_wheels() -> Path:
    """The host lock's wheels that this machine's environment does not hold at the pinned version,
    fetched by the suite itself into its cache (~/.cache/sdcloud-tests/lock-wheels, or
    $SDCLOUD_LOCK_WHEELS), once for all workers (a file lock): the mainland first boot's package
    mirror serves exactly the lock (tests/support/fake_mainland.py: lock_index), and the README's
    test command must pass with nothing fetched beforehand."""
    from tests.support.fake_mainland import fetch_lock_wheels

    return fetch_lock_wheels()


@pytest.fixture(scope="session")
def sshd():
    """A real OpenSSH server on 127.0.0.1 for the SSH provider (tests/support/server_sshd.py), one per
    worker; the tests that need it skip, saying why, where openssh-server is not installed."""
    from tests.support.server_sshd import Sshd

    why = Sshd.missing()
    if why:
        pytest.skip(why)
    server = Sshd().start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def sdcloud_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "sdcloud-home"
    monkeypatch.setenv("SDCLOUD_HOME", str(home))
    # Never reach a real cloud from a test, and never pick up the developer's credentials.
    for var in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                "TENCENTCLOUD_SECRET_ID", "TENCENTCLOUD_SECRET_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # boto3's default session keeps the keys it first found: a test's stores sign with the keys its
    # own environment holds, never with those an earlier test on this worker left there.
    if "boto3" in sys.modules:
        sys.modules["boto3"].DEFAULT_SESSION = None
    # Output detail is a process-wide setting (-q/-v): a test starts at normal, whatever ran before it.
    from sdcloud import render

    monkeypatch.setattr(render, "VERBOSITY", 0)
    return home


class Clock:
    """A calendar clock that stands still until a test moves it (sdcloud.clock.utc_now)."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def set(self, now: datetime | str) -> None:
        self.now = datetime.fromisoformat(now) if isinstance(now, str) else now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    """Freeze sdcloud's calendar clock, so that an age or a date in a test never depends on the hour
    the suite runs at. Starts at 2026-12-01 12:00 UTC; `clock.set("2026-12-01T23:59:00+00:00")` moves it.

    To check that the whole suite passes at any hour, run it with every process's clock moved to
    23:59 UTC today (libfaketime; the clock keeps running, so the run crosses midnight): see
    docs/testing.md. SeaweedFS, which libfaketime cannot move, is then reached through
    tests/support/fronts/front_clock.py (see `seaweed`).
    """
    from sdcloud import clock as sdclock

    fixed = Clock(datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc))
    monkeypatch.setattr(sdclock, "utc_now", fixed)
    return fixed


@pytest.fixture(scope="session")
def seaweed() -> SeaweedS3:
    """One real S3 server (SeaweedFS `weed mini`) per session (per worker under pytest-xdist); tests
    use their own buckets. Under a clock moved by libfaketime (FAKETIME set), which cannot move weed's
    (a Go program), the server is reached through tests/support/fronts/front_clock.py, which signs each request
    again at weed's time: weed refuses requests signed 15 minutes or more from its own time."""
    server = SeaweedS3().start()
    yield server
    server.stop()


@pytest.fixture
def s3_env(seaweed, monkeypatch) -> dict:
    """Credentials and HTTPS endpoint for the SeaweedFS server (it accepts any key when no identity is set).

    AWS_CA_BUNDLE makes boto3, awscli and every agent process started from the test trust the
    server's self-signed certificate, as a real host trusts its cloud's.
    """
    env = {"AWS_ACCESS_KEY_ID": "sdcloud-test", "AWS_SECRET_ACCESS_KEY": "sdcloud-test-secret",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": seaweed.endpoint,
           "AWS_CA_BUNDLE": str(seaweed.ca_file)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return {**env, "endpoint_url": seaweed.endpoint}


def shared_data(*parts: str) -> Path:
    path = SHARED.joinpath("data", *parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: the shared reference data is needed for this test")
    return path


@pytest.fixture
def aws_env(monkeypatch) -> None:
    """Fake AWS credentials in us-east-1, for moto."""
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)


@pytest.fixture(scope="module")
def moto_server() -> str:
    """moto's ThreadedMotoServer on a free loopback port: AWS over real HTTP."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    # moto keeps its accounts in this process, for every server and mock_aws in it: a file starts
    # with none of the instances, buckets or parameters an earlier file left (under pytest-xdist a
    # worker runs the files in another order than a serial run).
    _moto_reset(url)
    yield url
    _moto_reset(url)
    server.stop()


def _moto_reset(url: str) -> None:
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=30).close()


@pytest.fixture(scope="module")
def cos_layer(seaweed):
    """COS as it answers, at its own host names over HTTPS, in front of SeaweedFS (tests/support/fronts/front_cos.py)."""
    from tests.support.fronts.front_cos import CosLayer

    with CosLayer(seaweed) as layer:
        yield layer


@pytest.fixture
def cos_env(cos_layer, monkeypatch):
    """Tencent keys that the SeaweedFS behind the layer knows, and the way to the layer (HTTPS_PROXY, CA bundle)."""
    from tests.support.server_seaweed import TEST_KEYS

    for k, v in {**cos_layer.env, "TENCENTCLOUD_SECRET_ID": "sdcloud-test", "TENCENTCLOUD_SECRET_KEY": TEST_KEYS["sdcloud-test"],
                 "AWS_ACCESS_KEY_ID": "sdcloud-test", "AWS_SECRET_ACCESS_KEY": TEST_KEYS["sdcloud-test"]}.items():
        monkeypatch.setenv(k, v)
    return cos_layer
