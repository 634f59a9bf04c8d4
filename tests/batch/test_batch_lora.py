"""A LoRA file on the tiny pipeline: loaded by the batch generator, it changes the images; the image
keys name the LoRA by content."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")


def _lora_file(tmp_path):
    from diffusers import StableDiffusionPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict
    from sdcloud_agent.trainers import tiny

    c = tiny.build_components()
    unet = c["unet"]
    unet.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                                target_modules=["to_k", "to_q", "to_v", "to_out.0"]))
    with torch.no_grad():
        for name, p in unet.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # a strong, non-zero update: the images must change
    from diffusers.utils import convert_state_dict_to_diffusers

    StableDiffusionPipeline.save_lora_weights(tmp_path, unet_lora_layers=convert_state_dict_to_diffusers(
        get_peft_model_state_dict(unet)))
    return tmp_path / "pytorch_lora_weights.safetensors"


def test_lora_changes_the_images_and_its_identity_is_its_content(tmp_path):
    from sdcloud_agent.batch.generate import DiffusersGenerator

    from sdcloud.batch.jobs import lora_identity

    lora = _lora_file(tmp_path)
    settings = {"prompt": "a red cube", "negative_prompt": "", "steps": 2, "guidance": 5.0, "width": 64,
                "height": 64, "scheduler": "ddim"}
    plain = DiffusersGenerator.from_job({"model": "tiny", "tier": "batch-sd15"}).generate(settings, [1], threading.Event())
    with_lora = DiffusersGenerator.from_job({"model": "tiny", "tier": "batch-sd15", "lora": str(lora)}).generate(
        settings, [1], threading.Event())
    assert plain[0] != with_lora[0], "the LoRA was not applied"
    copy = tmp_path / "renamed" / lora.name
    copy.parent.mkdir()
    copy.write_bytes(lora.read_bytes())
    assert lora_identity(str(copy)) == lora_identity(str(lora)) and "@sha256:" in lora_identity(str(lora))


# -- --lora RUN: a finished training run's LoRA artifact, resolved at submit -----------------------

def _fake_run(run_id: str, state: str, lora: bytes | None) -> None:
    """A training run row in the state store and, if given, its LoRA artifact in the run's bucket."""
    from sdcloud import config
    from sdcloud.runs.inputs.spec import RunSpec
    from sdcloud.runs.records.state import StateStore

    st = StateStore()
    st.create_run(run_id, "sd15-lora", RunSpec(tier="sd15-lora", provider="local").as_dict(), 10)
    st.update_run(run_id, state=state)
    if lora is not None:
        target = config.home() / "bucket" / "runs" / run_id / "artifacts" / "pytorch_lora_weights.safetensors"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(lora)


@pytest.mark.parametrize("state,has_lora,needle", [
    ("running", True, "the run is running, not succeeded"),
    ("succeeded", False, "the run has no LoRA artifact"),
    (None, False, "no training run with that id"),
])
def test_lora_run_that_cannot_serve_is_refused_at_submit(capsys, tmp_path, state, has_lora, needle):
    from sdcloud.cli import main

    if state is not None:
        _fake_run("r-0badbeef", state, b"x" if has_lora else None)
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red cube\n")
    rc = main(["batch", "submit", "--tier", "batch-sd15", "--model", "tiny", "--generator", "fake", "--detach",
               "--prompts", str(prompts), "--lora", "r-0badbeef"])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    from sdcloud.runs.records.state import StateStore

    assert not [r for r in StateStore().list_runs() if r["spec"].get("kind") == "batch"], "nothing was submitted"


def _run_job(job_id: str) -> dict[str, bytes]:
    """One in-process worker over the job with the tiny pipeline, as a host runs it: {image key: png}."""
    import json

    from sdcloud_agent.batch.__main__ import prepare_job
    from sdcloud_agent.batch.generate import DiffusersGenerator
    from sdcloud_agent.batch.verify import verify
    from sdcloud_agent.batch.worker import Worker

    from sdcloud.batch.jobs import find_job
    from sdcloud.runs.records.store import open_run_store

    spec = find_job(job_id)["spec"]
    store = open_run_store(spec["store"])
    job = prepare_job(store, json.loads(store.get(f"{spec['prefix']}/job.json")))
    Worker(store, spec["prefix"], DiffusersGenerator.from_job(job), idle_wait=0.01).run()
    assert verify(store, spec["prefix"]).ok
    return {o.key.rsplit("/", 1)[-1]: store.get(o.key) for o in store.list(f"{spec['prefix']}/images/")}


def test_lora_run_is_fetched_by_the_worker_and_named_in_the_image_keys(tmp_path):
    import hashlib
    import json

    from sdcloud.batch.jobs import SubmitOptions, submit
    from sdcloud.runs.records.store import open_run_store

    lora = _lora_file(tmp_path / "trained").read_bytes()
    _fake_run("r-1a2b3c4d", "succeeded", lora)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a red cube", "steps": 2, "width": 64, "height": 64, "scheduler": "ddim"}\n')

    def opts(lora_arg):
        return SubmitOptions(tier="batch-sd15", model="tiny", prompts=str(prompts), lora=lora_arg, images_per_prompt=2,
                             workers=1, provider="local")
    with_run = submit(opts("r-1a2b3c4d"))
    plain = submit(opts(None))
    a, b = _run_job(with_run["job"]), _run_job(plain["job"])
    assert len(a) == len(b) == 2
    assert not set(a) & set(b), "the LoRA's identity must be part of the image keys"
    assert sorted(a.values()) != sorted(b.values()) and not set(a.values()) & set(b.values()), "the LoRA was not applied"
    # The job names the run and the file's content, and keeps its own copy of the file.
    from sdcloud.batch.jobs import find_job

    spec = find_job(with_run["job"])["spec"]
    ident = f"r-1a2b3c4d@sha256:{hashlib.sha256(lora).hexdigest()[:16]}"
    store = open_run_store(spec["store"])
    assert spec["lora"] == ident and json.loads(store.get(f"{spec['prefix']}/job.json"))["lora"] == ident
    assert store.get(spec["lora_key"]) == lora
    items = [json.loads(ln) for ln in store.get(f"{spec['prefix']}/items.jsonl").decode().splitlines()]
    assert {it["settings"]["lora"] for it in items} == {ident}
