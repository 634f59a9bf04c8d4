"""The suite fetches the host lock's wheels it lacks itself (tests/support/fake_mainland.py:
fetch_lock_wheels, the `lock_wheels` fixture): only those this environment does not hold at the
pinned version, once for all workers, and nothing when the cache already has them."""

from __future__ import annotations

import threading
import time

from tests.support import fake_mainland


def _recording(calls: list[list[str]], pause: float = 0.0):
    def download(pins: list[str], folder) -> None:
        calls.append(list(pins))
        time.sleep(pause)
        for pin in pins:
            name, version = pin.split("==")
            (folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").write_bytes(b"")
    return download


def test_only_the_pins_this_environment_lacks_are_fetched_and_only_once(tmp_path, monkeypatch):
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    pins = fake_mainland._lock_pins()
    drifted = {pins[0][0], pins[-1][0]}  # a newer release of these is installed here
    monkeypatch.setattr(fake_mainland, "_installed_as_pinned", lambda name, version: name not in drifted)
    calls: list[list[str]] = []
    folder = tmp_path / "lock-wheels"

    assert fake_mainland.fetch_lock_wheels(folder, download=_recording(calls)) == folder
    assert calls == [[f"{n}=={v}" for n, v in pins if n in drifted]]
    assert fake_mainland.missing_lock_wheels(folder) == []
    fake_mainland.fetch_lock_wheels(folder, download=_recording(calls))
    assert len(calls) == 1, "a full cache fetches nothing"


def test_workers_that_ask_at_once_fetch_once(tmp_path, monkeypatch):
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setattr(fake_mainland, "_installed_as_pinned", lambda name, version: False)
    calls: list[list[str]] = []
    folder = tmp_path / "lock-wheels"
    workers = [threading.Thread(target=fake_mainland.fetch_lock_wheels, args=(folder,),
                                kwargs={"download": _recording(calls, pause=0.3)}) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(calls) == 1 and len(calls[0]) == len(fake_mainland._lock_pins())


def test_a_failed_fetch_is_said_and_left_to_the_index_to_name(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    import subprocess

    monkeypatch.setattr(fake_mainland, "_installed_as_pinned", lambda name, version: False)

    def offline(pins, folder):
        raise subprocess.CalledProcessError(1, ["pip", "download"])

    fake_mainland.fetch_lock_wheels(tmp_path / "w", download=offline)
    assert "could not fetch the lock's wheels" in capsys.readouterr().err
