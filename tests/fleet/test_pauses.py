"""A run on the Vast.ai fake: an outbid pauses its host with no notice, and the pause policy (spot/pause.py,
through fleet/pauses.py) waits for it on the same machine, raises the bid, or relaunches elsewhere."""

from __future__ import annotations

import pytest

from sdcloud.providers import get_provider
from sdcloud.runs.driving.controller import Controller
from sdcloud.runs.records.state import StateStore

from tests.support.clouds.fake_vast import KEY, FakeVastServer


@pytest.fixture
def vast(tmp_path, monkeypatch):
    with FakeVastServer(tmp_path / "tls") as srv:
        for k, v in {"SDCLOUD_VAST_ENDPOINT": srv.url, "VAST_API_KEY": KEY, "SSL_CERT_FILE": str(srv.ca_file)}.items():
            monkeypatch.setenv(k, v)
        yield srv.fake


def _controller(tmp_path, run_id: str, **spec_more) -> Controller:
    state = StateStore()
    spec = {"tier": "sdxl-lora", "provider": "vast", "model": "tiny", "steps": 100, "market": "spot",
            "store": (tmp_path / "bucket").as_uri(), **spec_more}
    state.create_run(run_id, "sdxl-lora", spec, 100)
    return Controller(state, run_id, provider=get_provider("vast", backoff=0.0))


def _launch(ctl: Controller):
    """Launch as the controller's steps do: an offer with no machine on sale now moves on to the next (bounded)."""
    for _ in range(len(ctl.candidates)):
        ctl._start_attempt()
        if ctl.current() is not None:
            return ctl.current()
    raise AssertionError("no offer launched")


def _kinds(ctl: Controller) -> list[str]:
    return [e["kind"] for e in ctl.state.events(ctl.run_id)]


def test_an_outbid_host_is_waited_for_and_resumes_on_the_same_machine(vast, tmp_path, sdcloud_home):
    ctl = _controller(tmp_path, "r-pause01")
    a1 = _launch(ctl)
    assert all(b.get("price") is not None for b in vast.creates())  # a spot run: never a create without the bid
    machine = vast.instances[int(a1.instance_id)].ask["machine_id"]
    vast.outbid(a1.instance_id, min_bid=5.0)  # no deadline, no history: wait for it
    ctl._watch(ctl.current())
    assert ctl.current() is not None and ctl.current().instance_id == a1.instance_id, "a paused host was given up at once"
    assert "host-paused" in _kinds(ctl)
    vast.resume(a1.instance_id)
    ctl._watch(ctl.current())
    assert ctl.current().instance_id == a1.instance_id and vast.instances[int(a1.instance_id)].ask["machine_id"] == machine
    assert "host-resumed" in _kinds(ctl) and "reclaimed" not in _kinds(ctl)
    ctl.fleet.end(ctl.current(), "stopped")
    assert vast.instances == {}


def test_a_deadline_that_cannot_wait_raises_the_bid_within_max_price(vast, tmp_path, sdcloud_home):
    ctl = _controller(tmp_path, "r-pause02", deadline_hours=1.0, max_price=1.0)
    a1 = _launch(ctl)
    vast.outbid(a1.instance_id, min_bid=0.17)  # outbid by a little: a raise costs less than a relaunch
    ctl._watch(ctl.current())
    inst = vast.instances[int(a1.instance_id)]
    assert inst.bid_price == pytest.approx(0.17 * 1.15) and not inst.paused  # won back over the machine's new minimum
    assert any(e["kind"] == "host-paused" and e["data"]["choice"] == "raise-bid" for e in ctl.state.events(ctl.run_id))
    assert ctl.current().instance_id == a1.instance_id
    ctl.fleet.end(ctl.current(), "stopped")


def test_a_deadline_past_max_price_relaunches_elsewhere_and_ends_the_paused_host(vast, tmp_path, sdcloud_home):
    ctl = _controller(tmp_path, "r-pause03", deadline_hours=1.0, max_price=0.5)
    a1 = _launch(ctl)
    vast.outbid(a1.instance_id, min_bid=2.0)  # the winning bid is over --max-price
    ctl._watch(ctl.current())
    ended = next(a for a in ctl.attempts() if a.n == a1.n)
    assert ended.end_reason == "preempted" and int(a1.instance_id) not in vast.instances
    a2 = _launch(ctl)
    assert a2.n > a1.n and a2.instance_id != a1.instance_id
    assert vast.instances[int(a2.instance_id)].ask["id"] != vast.ended[int(a1.instance_id)].ask["id"]
    ctl.fleet.end(a2, "stopped")
    assert vast.instances == {}  # nothing left, the paused host included
