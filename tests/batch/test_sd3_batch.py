"""batch-sd35: batch generation with an SD3-shaped pipeline (three text encoders, a 16-channel VAE,
flow matching) and an SD3 LoRA the builtin trainer made; every image rendered exactly once (verify)."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from PIL import Image

from tests.support.fake_sd3_model import tiny_folder

pytest.importorskip("torch")


def _trained_lora(tmp_path):
    """A LoRA of the tiny SD3 folder, trained by the builtin trainer as a run trains it."""
    data = tmp_path / "photos"
    data.mkdir()
    for n in range(2):
        Image.new("RGB", (32, 32), (n * 90, 60, 200)).save(data / f"p{n}.png")
    out = tmp_path / "lora"
    proc = subprocess.run([sys.executable, "-m", "sdcloud_agent.trainers.builtin", "--model", str(tiny_folder()),
                           "--family", "sd3", "--steps", "4", "--lr", "1e-2", "--resolution", "32", "--data-dir", str(data),
                           "--output", str(out), "--checkpoint-dir", str(tmp_path / "ck"), "--device", "cpu"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out / "pytorch_lora_weights.safetensors"


def test_batch_sd35_renders_every_image_once_with_the_lora(tmp_path):
    from sdcloud_agent.batch import layout
    from sdcloud_agent.batch.generate import DiffusersGenerator
    from sdcloud_agent.batch.verify import verify
    from sdcloud_agent.batch.worker import Worker, write_job
    from sdcloud_agent.store import LocalStore

    from sdcloud.batch.jobs import BATCH_TIERS, lora_identity
    from sdcloud.batch.prompts import build_items, parse_prompts

    lora = _trained_lora(tmp_path)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a photo of sks toy", "count": 3, "steps": 2, "width": 64, "height": 64}\n'
                       '{"prompt": "a blue sphere", "steps": 2, "width": 96, "height": 64}\n')
    model = str(tiny_folder())
    items = build_items(parse_prompts(str(prompts), BATCH_TIERS["batch-sd35"], 1, model=model), model,
                        lora_identity(str(lora)))
    assert {it["settings"]["scheduler"] for it in items} == {"flow_euler"}, "SD3.5's sampler applies"
    assert {it["settings"]["guidance"] for it in items} == {4.5}
    store = LocalStore(tmp_path / "bucket")
    job = {"tier": "batch-sd35", "model": model, "lora": str(lora)}
    write_job(store, "batch/j", job, items)

    gen = DiffusersGenerator.from_job(job)
    assert type(gen.pipe).__name__ == "StableDiffusion3Pipeline" and gen.pipe.text_encoder_3 is not None
    stats = Worker(store, "batch/j", gen, idle_wait=0.01).run()
    assert stats.items_done == len(items) and stats.images_made == 4
    v = verify(store, "batch/j")
    assert v.ok and v.images_present == 4 and not v.stray_images, v.as_dict()
    it = items[0]
    png = store.get(layout.image_path("batch/j", layout.image_key(it["settings"], it["seeds"][0])))
    img = Image.open(io.BytesIO(png))
    assert img.size == (64, 64) and img.text["prompt"] == "a photo of sks toy"
    # The LoRA is applied: the same seed renders another image without it.
    plain = DiffusersGenerator.from_job({**job, "lora": None})
    import threading

    settings = dict(it["settings"])
    assert plain.generate(settings, it["seeds"][:1], threading.Event())[0] != gen.generate(
        settings, it["seeds"][:1], threading.Event())[0]


def test_batch_sd35_prompts_and_models_are_checked_before_launch(tmp_path, sdcloud_home):
    from sdcloud.batch.prompts import parse_prompts
    from sdcloud.batch.submit import SubmitOptions, validate
    from sdcloud.errors import UserError
    from sdcloud_agent.trainers import tiny

    p = tmp_path / "p.txt"
    p.write_text("a lighthouse at dusk\n")
    (pr,) = parse_prompts(str(p), "sd3", 1, model="stabilityai/stable-diffusion-3.5-medium")
    assert (pr.width, pr.height, pr.steps, pr.guidance, pr.scheduler) == (1024, 1024, 40, 4.5, "flow_euler")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "scheduler": "ddim"}\n')
    with pytest.raises(UserError, match="scheduler must be one of flow_euler"):
        parse_prompts(str(bad), "sd3", 1)
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"prompt": "x", "width": 1000, "height": 1024}\n')
    with pytest.raises(UserError, match="multiples of 16 for SD3, got 1000x1024"):
        parse_prompts(str(odd), "sd3", 1)
    flow = tmp_path / "flow.jsonl"
    flow.write_text('{"prompt": "x", "scheduler": "flow_euler"}\n')
    with pytest.raises(UserError, match="scheduler must be one of ddim"):
        parse_prompts(str(flow), "sdxl", 1)
    xl = tiny.save_pipeline(tmp_path / "xl", family="sdxl")
    with pytest.raises(UserError, match="is an sdxl model but tier batch-sd35 renders with sd3"):
        validate(SubmitOptions(tier="batch-sd35", prompts=str(p), model=str(xl), provider="local"))
