"""Everything a run needs is in its bucket before it is handed over (sdcloud.runs.inputs.staging).

A user's run as users make it: a dataset folder of images and captions, a local model file, and a
config.toml whose [network] mirror and [hosts] grace must reach every host. The laptop hands the run
over (what `up --unattended` does), then its paths are gone; the cloud function's handler, from a
home of its own that holds nothing but the bucket's URL, launches from the bucket's references with
the run's settings, and again after a reclaim from yet another empty home (a killed laptop's
controller is the same: the journal and the lease are all the function ever sees). A second live
run that cannot be launched (an older run whose dataset is on nobody's disk) is reported on its own
and never stops the first run's steps.
"""

from __future__ import annotations

import json
import shutil
import time

import pytest

from sdcloud_agent.store import LocalStore

MIRROR = "https://pypi.mirror.example/simple"


def _user_inputs(root):
    """A dataset folder (small real PNGs with captions) and a local .safetensors model file."""
    import numpy as np
    from PIL import Image
    from safetensors.numpy import save_file

    ds = root / "my-dog"
    ds.mkdir(parents=True)
    for i in range(3):
        Image.new("RGB", (64, 64), (60 * i, 200 - 50 * i, 90)).save(ds / f"dog{i}.png")
        (ds / f"dog{i}.txt").write_text(f"a photo of sks dog, pose {i}")
    model = root / "models" / "base-v1.safetensors"
    model.parent.mkdir()
    save_file({"w": np.arange(16, dtype=np.float32).reshape(4, 4)}, str(model))
    return ds, model


class Recording:
    """test_fleet's in-process cloud, keeping every launch's LaunchSpec."""

    def __new__(cls):
        from tests.fleet.test_fleet import CloudDouble

        cloud = CloudDouble()
        cloud.specs = []
        real = cloud.launch

        def launch(offer, spec, market, max_price, events=None):
            cloud.specs.append(spec)
            return real(offer, spec, market, max_price, events)

        cloud.launch = launch
        return cloud


def rounds(n: int):
    """The function's time left, as the handler asks it: plenty for its first `n` questions, then none
    (so an invocation takes a round or two of steps however fast this machine is)."""
    asked = [0]

    def left() -> float:
        asked[0] += 1
        return 1000.0 if asked[0] <= n else 0.0
    return left


def _agent(spec) -> dict:
    """The agent config a host got, read back from its user-data (the config the host boots with)."""
    text = spec.user_data
    start = text.index('{"', text.index("SDCLOUD_CONFIG"))
    return json.JSONDecoder().raw_decode(text[start:])[0]


@pytest.mark.parametrize("how", ["up-unattended", "controller-killed"])
def test_a_handed_over_run_launches_from_the_bucket_with_the_laptops_settings(tmp_path, monkeypatch, sdcloud_home,
                                                                              how):
    """`up --unattended` hands the run over at once; a laptop controller that was killed after it
    launched passes it on when its lease lapses (then the first host is reclaimed, and the function
    relaunches it). Either way the function launches from the bucket, under the laptop's settings."""
    from sdcloud.runs.records import lease as driver_mod
    from sdcloud.driver import unattended
    from sdcloud.runs.driving.controller import Controller
    from sdcloud.runs.records.journal import Journal
    from sdcloud.runs.records.state import StateStore

    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text(f'[network]\npip_index_url = "{MIRROR}"\n\n[hosts]\nself_end_grace = "7m"\n')
    ds, model = _user_inputs(tmp_path / "laptop")
    bucket = tmp_path / "bucket"
    store = LocalStore(bucket)
    spec = {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1", "model": str(model), "dataset": str(ds),
            "steps": 100, "market": "spot", "store": bucket.as_uri()}
    laptop = StateStore()
    laptop.create_run("r-hand0001", "sd15-lora", spec, 100)
    cloud = Recording()
    monkeypatch.setattr("sdcloud.runs.driving.controller.get_provider", lambda name, **kw: cloud)
    if how == "up-unattended":
        Controller(laptop, "r-hand0001", provider=cloud).hand_over()
    else:
        monkeypatch.setattr(driver_mod, "MIN_LEASE_SECONDS", 0.2)  # a lease that lapses at once here
        monkeypatch.setattr(driver_mod, "LEASE_POLLS", 0)
        ctl = Controller(laptop, "r-hand0001", provider=cloud, driver="laptop")
        ctl.lease.acquire_or_refuse()
        ctl.reconcile()
        assert not ctl.step() and len(cloud.specs) == 1, "the laptop launched the first host"
    laptop_launches = len(cloud.specs)

    # In the bucket before the journal lists the run: the images, the captions, the model by content.
    keys = {o.key for o in store.list("runs/r-hand0001/dataset/")}
    assert keys == {f"runs/r-hand0001/dataset/dog{i}{ext}" for i in range(3) for ext in (".png", ".txt")}
    assert [o.key for o in store.list("cache/models/") if o.key.endswith(".tar")], "the model is in the cache"
    assert store.head("drivers/active/r-hand0001") is not None
    if how == "up-unattended":
        assert store.head("runs/r-hand0001/leases/driver.json") is None, "nobody drives it: the function takes it"
    else:  # the laptop's controller is killed: no more steps, no goodbye; its host is reclaimed
        time.sleep(0.3)
        cloud.reclaim(cloud.live()[0].id)

    # An older run in the same bucket, live, whose dataset is on no disk and in no record.
    old = {**spec, "dataset": str(tmp_path / "gone" / "photos"), "model": "tiny"}
    laptop.create_run("r-olde0002", "sd15-lora", old, 100)
    Journal(laptop, store, "r-olde0002").flush()

    # The laptop's paths are gone; the function has a home of its own.
    shutil.rmtree(ds)
    model.unlink()
    monkeypatch.setenv("SDCLOUD_STORE", bucket.as_uri())
    monkeypatch.setenv("SDCLOUD_DRIVER_SECONDS", "600")
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "function-1"))
    first = unattended.drive_lapsed(unattended._store_conf(), "aws-lambda", rounds(4), sleep=lambda s: None)
    assert first["runs"]["r-hand0001"]["steps"] >= 1, first
    assert "not on this machine" in first["runs"]["r-olde0002"]["error"], first
    for _ in range(3):
        if len(cloud.specs) > laptop_launches:
            break
        unattended.drive_lapsed(unattended._store_conf(), "aws-lambda", rounds(4), sleep=lambda s: None)
    assert len(cloud.specs) == laptop_launches + 1 and not (tmp_path / "function-1" / "config.toml").exists()

    def check(launch) -> None:
        agent = _agent(launch)
        assert agent["dataset"] == bucket.as_uri() + "/runs/r-hand0001/dataset"
        assert agent["model"].startswith("cache:cache/models/local-") and agent["model"].endswith("#base-v1.safetensors")
        assert agent["network"]["pip_index_url"] == MIRROR, "config.toml's [network] reached the host"
        assert agent["self_end"]["grace_s"] == 420.0, "config.toml's [hosts] grace reached the host"

    check(cloud.specs[-1])
    # A reclaim; the next invocation, from another empty home, relaunches with the same inputs.
    cloud.reclaim(cloud.live()[0].id)
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "function-2"))
    for _ in range(3):
        unattended.drive_lapsed(unattended._store_conf(), "aws-lambda", rounds(4), sleep=lambda s: None)
        if len(cloud.specs) >= laptop_launches + 2:
            break
    assert len(cloud.specs) == laptop_launches + 2 and len(cloud.live()) == 1
    for launch in cloud.specs:
        check(launch)
    # The record, as the bucket's journal holds it.
    staged = [e["data"] for o in store.list("runs/r-hand0001/journal/events/") for e in json.loads(store.get(o.key))
              if e["kind"] == "inputs-staged"]
    assert staged and all(d["settings"]["network"] == {"pip_index_url": MIRROR} for d in staged)
    assert all(d["dataset"] == bucket.as_uri() + "/runs/r-hand0001/dataset" for d in staged)
    assert all(d["drive"] == ("cloud" if how == "up-unattended" else None) for d in staged)


def test_a_run_whose_dataset_cannot_be_staged_is_not_handed_over(tmp_path, monkeypatch, sdcloud_home):
    """The hand-over stages first: a model file that vanished refuses it, and the journal lists nothing."""
    from sdcloud.errors import UserError
    from sdcloud.runs.driving.controller import Controller
    from sdcloud.runs.records.state import StateStore

    ds, model = _user_inputs(tmp_path / "laptop")
    bucket = tmp_path / "bucket"
    laptop = StateStore()
    laptop.create_run("r-hand0003", "sd15-lora", {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1",
                                                  "model": str(model), "dataset": str(ds), "steps": 100,
                                                  "store": bucket.as_uri()}, 100)
    cloud = Recording()
    ctl = Controller(laptop, "r-hand0003", provider=cloud)
    model.unlink()
    with pytest.raises(UserError, match="not on this machine"):
        ctl.hand_over()
    assert LocalStore(bucket).head("drivers/active/r-hand0003") is None


def test_a_mainland_run_carries_its_trainer_sources_before_the_hand_over(tmp_path, monkeypatch, sdcloud_home):
    """A Tencent mainland run's hosts take kohya's sources from the bucket only: the laptop carries them
    when it hands the run over, and the function (no archive in its home, no GitHub) launches with them
    already there."""
    from sdcloud.driver import unattended
    from sdcloud.runs.driving.controller import Controller
    from sdcloud.runs.inputs.carry import cache_dir
    from sdcloud.runs.records.state import StateStore
    from sdcloud_agent import scripts
    from tests.runs.clouds.test_mainland_network import KOHYA, fake_kohya_archive

    bucket = tmp_path / "bucket"
    store = LocalStore(bucket)
    laptop = StateStore()
    laptop.save_infra("tencent", "ap-guangzhou", {"region": "ap-guangzhou"})
    laptop.create_run("r-ma1n0001", "sd15-lora", {
        "tier": "sd15-lora", "provider": "tencent", "region": "ap-guangzhou", "model": "tiny", "steps": 100,
        "market": "spot", "store": bucket.as_uri(), "trainer": "kohya",
        "trainer_args": {"network_module": "networks.lora"}}, 100)
    fake_kohya_archive(cache_dir() / f"kohya-{KOHYA[:12]}.tar")
    cloud = Recording()
    monkeypatch.setattr("sdcloud.runs.driving.controller.get_provider", lambda name, **kw: cloud)
    Controller(laptop, "r-ma1n0001", provider=cloud).hand_over()
    assert store.head(f"cache/trainers/kohya-{KOHYA[:12]}.tar") is not None, "carried before the hand-over"
    staged = [e["data"] for e in laptop.events("r-ma1n0001") if e["kind"] == "inputs-staged"]
    assert staged[-1]["trainer_sources"] == "uploaded" and staged[-1]["effective"]["network_profile"] == "mainland"

    monkeypatch.setattr(scripts, "pack", lambda *a, **k: pytest.fail("the function fetched trainer sources"))
    monkeypatch.setenv("SDCLOUD_STORE", bucket.as_uri())
    monkeypatch.setenv("SDCLOUD_DRIVER_SECONDS", "600")
    monkeypatch.setenv("SDCLOUD_HOME", str(tmp_path / "function"))
    report = unattended.drive_lapsed(unattended._store_conf(), "tencent-scf", rounds(4), sleep=lambda s: None)
    assert "error" not in report["runs"]["r-ma1n0001"], report
    assert len(cloud.specs) == 1 and _agent(cloud.specs[0])["network"]["trainer_sources"] == "bucket"
