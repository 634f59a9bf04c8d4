"""One rule for moves between clouds: a two-cloud run driven on the fakes along a spot trace, and the
same trace replayed by `sdcloud simulate`'s replay, make the same decisions at the same ticks.

The run: `--provider aws,tencent`, AWS on moto's server, Tencent on the CVM fake, both stores buckets on
the SeaweedFS fixture. The trace: in ticks 0-1 AWS refuses every spot launch, in tick 2 Tencent does,
then both have spot. The controller is stepped once a tick; its launches, refused or not, and its moves
(the copy, then the launch) are read back from its attempts and events. The replay is given the
controller's own zones (each with its cloud and catalog prices), its job's hours and deadline, and the
move's hours and egress the controller measured and priced (runs/driving/placement.py: across)."""

from __future__ import annotations

import time

import boto3
import numpy as np

AMI = "ami-12c6146b"  # one of moto's stock images
POLL = 60  # seconds: the controller's poll is the replay's tick (the test steps it, nothing sleeps)
REFUSING = {"aws": {0, 1}, "tencent": {2}}  # the ticks each cloud refuses spot in
TICKS = 4


def test_a_two_cloud_run_and_its_replay_move_at_the_same_ticks(moto_server, s3_env, monkeypatch, dataset):
    from tests.support import fake_tencent_api
    from tests.support.fake_tencent_api import SECRET_ID, SECRET_KEY, FakeServer

    from sdcloud.events import Kind
    from sdcloud.fleet.candidates import attempt_zone_key
    from sdcloud.fleet.lifecycle import Fleet
    from sdcloud.offers.optimizer import RESTART_HOURS
    from sdcloud.providers import get_provider
    from sdcloud.providers.base import CapacityError
    from sdcloud.runs.driving.controller import Controller, Timing, new_run_id
    from sdcloud.runs.driving.placement import Clouds, across
    from sdcloud.runs.records.state import StateStore
    from sdcloud.spot.policy import SPOT, get_policy
    from sdcloud.spot.simulate import Setting, replay

    for k, v in {"AWS_ENDPOINT_URL": moto_server, "SDCLOUD_STORE_ENDPOINT": s3_env["endpoint_url"],
                 "TENCENTCLOUD_SECRET_ID": SECRET_ID, "TENCENTCLOUD_SECRET_KEY": SECRET_KEY,
                 "SDCLOUD_TENCENT_IMAGE_ID": "img-e2e"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(fake_tencent_api, "PENDING_S", 0.2)
    monkeypatch.setattr("sdcloud.providers.tencent.session.METADATA_URL", "http://127.0.0.1:9/")
    monkeypatch.setattr("sdcloud.spot.policy.SPOT_REFUSALS", 2)  # spot "gone" after two refusals, not twelve
    # The trace says when a zone has spot; the controller learns it only by a refused launch, after which
    # it cools the zone for half an hour. Without the cooldown it sees spot wherever the trace does.
    monkeypatch.setattr(Fleet, "cooldown_seconds", lambda self: 0.0)
    s3 = boto3.client("s3", endpoint_url=s3_env["endpoint_url"])
    for bucket in ("same-home", "same-tencent"):
        s3.create_bucket(Bucket=bucket)
    away = {"url": "s3://same-tencent/sdcloud", "endpoint_url": s3_env["endpoint_url"]}
    real_conf = Clouds.store_conf
    # The Tencent stack's bucket, as plain S3 on the fixture (the COS dialect is tested on its own).
    monkeypatch.setattr(Clouds, "store_conf", lambda self, name: away if name == "tencent" else real_conf(self, name))
    tick = {"k": 0}
    with FakeServer() as srv:
        monkeypatch.setenv("SDCLOUD_TENCENT_ENDPOINT", srv.endpoint)
        aws = get_provider("aws", image_id=AMI, region="us-east-1", regions=["us-east-1"])
        tencent = get_provider("tencent", poll_interval=0.2, launch_timeout=30)
        for name, provider in (("aws", aws), ("tencent", tencent)):
            real = provider.launch

            def launch(offer, spec, market, max_price=None, events=None, _real=real, _name=name):
                if market == SPOT and tick["k"] in REFUSING[_name]:
                    raise CapacityError("InsufficientInstanceCapacity: no spot capacity in this zone now")
                return _real(offer, spec, market, max_price, events=events)

            monkeypatch.setattr(provider, "launch", launch)
        state = StateStore()
        run_id = new_run_id()
        spec = {"tier": "sd15-lora", "provider": "aws", "providers": ["aws", "tencent"], "region": "us-east-1",
                "model": "tiny", "steps": 20000, "dataset": str(dataset), "store": "s3://same-home/sdcloud",
                "market": "spot", "deadline_hours": 100.0}
        state.create_run(run_id, "sd15-lora", spec, 20000)
        events: list = []
        ctl = Controller(state, run_id, provider=aws, emit=lambda kind, data: events.append((tick["k"], kind, data)),
                         timing=Timing(poll_seconds=POLL, boot_timeout=240, heartbeat_timeout=120),
                         clouds={"tencent": tencent})
        ctl.lease.acquire_or_refuse()
        ctl.reconcile()
        views = ctl.fleet.zone_views(time.time())
        terms = across(ctl.clouds, ctl.placement, ctl.ensure_inputs(), 0)
        job_hours = ctl.expected_job_hours()
        seen = 0
        ran: list[tuple] = []
        try:
            for k in range(TICKS):
                tick["k"] = k
                assert ctl.step() is False
                attempts = state.attempts(run_id)
                moved = any(t == k and kind is Kind.CLOUD_MOVED for t, kind, _ in events)
                for a in attempts[seen:]:
                    ran.append((k, a.market, attempt_zone_key(a.provider, a.region, a.zone, a.instance_type), moved,
                                a.end_reason == "launch-failed"))
                seen = len(attempts)
        finally:
            ctl.finish_stop("the test is over")
    keys, clouds = [v.key for v in views], [v.cloud for v in views]
    assert set(clouds) == {"aws", "tencent"} and terms is not None and terms.data_cloud == "aws"
    refused = np.zeros((len(keys), TICKS + 1), bool)
    for i, cloud in enumerate(clouds):
        refused[i, sorted(REFUSING[cloud])] = True
    avail = np.ones_like(refused)
    spot = np.array([[v.spot_price] * (TICKS + 1) for v in views])
    setting = Setting(job_hours, 100.0, RESTART_HOURS, move_hours=terms.move_hours, move_usd=terms.move_usd)
    log: list = []
    replay(get_policy("sdcloud"), avail, keys, POLL, 0, 0, setting, spot_prices=spot,
           ondemand_prices=np.array([v.ondemand_price for v in views]), refused=refused, clouds=clouds, log=log)
    replayed = [e for e in log if e[0] < TICKS]
    assert ran == replayed
    # What was decided, spelled out: two refusals at home (spot gone there: SPOT_REFUSALS), a move to the
    # other cloud's spot instead of on-demand, refused there; then, with AWS's spot open again and far cheaper
    # to finish on than Tencent's (MOVE_MARGIN), a move back that launches.
    assert [(k, key.split("/")[0], m, r) for k, _, key, m, r in ran] == [
        (0, "aws", False, True), (1, "aws", False, True), (2, "tencent", True, True), (3, "aws", True, False)]
    assert [d["to"] for _, kind, d in events if kind is Kind.CLOUD_MOVED] == ["tencent", "aws"]
