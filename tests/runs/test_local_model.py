"""A local base model on its way to a remote host: the controller packs it once, by its content,
as cache/models/local-<sha16>.tar in the run's bucket (SeaweedFS over HTTPS); a second run sends
nothing; the agent restores it on a fresh disk and hands the trainer a path that loads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tests.fleet.test_fleet import CloudDouble


@pytest.fixture
def bucket(seaweed, s3_env, monkeypatch):
    from sdcloud_agent.store import open_store

    monkeypatch.setenv("SDCLOUD_STORE_ENDPOINT", seaweed.endpoint)
    url = "s3://local-model/team"
    store = open_store({"url": url, "endpoint_url": seaweed.endpoint})
    store.ensure_bucket()
    for o in store.list("cache/"):
        store.delete(o.key)
    return url, store


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    from sdcloud_agent.trainers import tiny

    return tiny.save_pipeline(tmp_path_factory.mktemp("models") / "my-model")


def _single_file(path: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    save_file({"cond_stage_model.transformer.x.weight": torch.zeros(4),
               "model.diffusion_model.input_blocks.0.0.weight": torch.zeros(4)}, str(path))
    return path


def _controller(url: str, model: str, run_id: str):
    from sdcloud.runs.driving.controller import Controller
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    spec = {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1", "model": model, "steps": 10,
            "market": "spot", "store": url}
    state.create_run(run_id, "sd15-lora", spec, 10)
    events: list[tuple[str, dict]] = []
    return Controller(state, run_id, provider=CloudDouble(), emit=lambda k, d: events.append((k, d))), events


def _uploads(events) -> list[dict]:
    return [d for k, d in events if k == "model-uploaded"]


def test_a_local_folder_is_uploaded_once_by_content_and_restored_on_a_fresh_host(bucket, tiny_folder, tmp_path,
                                                                                 monkeypatch):
    from sdcloud_agent import models
    from sdcloud_agent.trainers.models import detect_family

    from sdcloud.runs.inputs import models as ctl_models

    url, store = bucket
    ctl, events = _controller(url, str(tiny_folder), "r-model001")
    agent = ctl.launching.launch_spec(1).agent_config
    ref = agent["model"]
    assert ref.startswith("cache:cache/models/local-") and ref.endswith(".tar") and "#" not in ref
    key = ref[len("cache:"):]
    assert ctl.launching.launch_spec(2).agent_config["model"] == ref  # once per controller
    (up,) = _uploads(events)
    assert up["cached"] is False and up["key"] == key and up["mb"] > 0 and up["files"] > 3
    assert store.head(key) is not None and not [o for o in store.list("cache/") if o.key.endswith(".part")]

    # A second run of the same model sends nothing, and reads no byte of it again (the hash is kept).
    with monkeypatch.context() as m:
        m.setattr(ctl_models, "content_hash", lambda files: pytest.fail("hashed again"))
        m.setattr(type(store), "put_file", lambda *a, **k: pytest.fail("uploaded again"))
        ctl2, events2 = _controller(url, str(tiny_folder), "r-model002")
        assert ctl2.launching.model_for_host() == ref
    (up2,) = _uploads(events2)
    assert up2["cached"] is True and up2["sent"] == 0

    # The same bytes under another name are the same cache entry.
    copy = shutil.copytree(tiny_folder, tmp_path / "elsewhere" / "renamed")
    ctl3, events3 = _controller(url, str(copy), "r-model003")
    assert ctl3.launching.model_for_host() == ref and _uploads(events3)[0]["cached"] is True

    # The agent on a fresh disk restores it; a diffusers folder stays a folder.
    path, how = models.stage(ref, store, tmp_path / "host1")
    assert how == "restored"
    staged = Path(path)
    assert staged.is_dir() and (staged / "model_index.json").is_file() and (staged / ".sdcloud-complete").exists()
    assert staged == tmp_path / "host1" / "models" / Path(key).stem
    assert detect_family(path) == "sd15"
    assert models.stage(ref, store, tmp_path / "host1") == (path, "local")


def test_a_single_file_stays_a_file(bucket, tmp_path):
    from sdcloud_agent import models
    from sdcloud_agent.trainers.models import detect_family

    url, store = bucket
    (tmp_path / "laptop").mkdir()
    ckpt = _single_file(tmp_path / "laptop" / "v1.safetensors")
    ctl, events = _controller(url, str(ckpt), "r-model004")
    ref = ctl.launching.model_for_host()
    assert ref.startswith("cache:cache/models/local-") and ref.endswith(".tar#v1.safetensors")
    assert _uploads(events)[0]["files"] == 1
    path, how = models.stage(ref, store, tmp_path / "host")
    assert how == "restored" and path.endswith("/v1.safetensors")
    assert Path(path).read_bytes() == ckpt.read_bytes()
    assert detect_family(path) == "sd15"


def test_a_missing_cache_key_fails_clearly(bucket, tmp_path):
    from sdcloud_agent import models

    _, store = bucket
    with pytest.raises(FileNotFoundError, match="not in the run's bucket"):
        models.stage("cache:cache/models/local-0123456789abcdef.tar", store, tmp_path / "host")
    assert not (tmp_path / "host" / "models" / "local-0123456789abcdef").exists()
    with pytest.raises(ValueError):
        models.stage("cache:elsewhere/x.tar", store, tmp_path / "host")


def test_the_local_provider_reads_the_model_in_place(tiny_folder):
    from sdcloud.runs.inputs.models import is_local_model

    assert not is_local_model(str(tiny_folder), "local")
    assert is_local_model(str(tiny_folder), "ssh") and is_local_model(str(tiny_folder), "tencent")
    assert not any(is_local_model(m, "aws") for m in ("tiny", "tiny-sdxl", "s3://b/m", "org/name", None))
