"""The batch-sdxl tier generates with an SDXL pipeline (two text encoders): a few items of a job on
CPU with the tiny random-weight SDXL model, then `verify`."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("torch")


def test_batch_sdxl_job_runs_on_the_tiny_sdxl_pipeline_and_verifies(tmp_path):
    from PIL import Image
    from sdcloud_agent.batch import layout
    from sdcloud_agent.batch.generate import DiffusersGenerator
    from sdcloud_agent.batch.verify import verify
    from sdcloud_agent.batch.worker import Worker, write_job
    from sdcloud_agent.store import LocalStore

    from sdcloud.batch.prompts import build_items, parse_prompts

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a red cube", "count": 3, "steps": 2, "width": 64, "height": 64}\n'
                       '{"prompt": "a blue sphere", "steps": 2, "width": 64, "height": 64, "scheduler": "ddim"}\n')
    from sdcloud.batch.jobs import BATCH_TIERS

    items = build_items(parse_prompts(str(prompts), BATCH_TIERS["batch-sdxl"], 1), "tiny", None)
    assert {it["settings"]["scheduler"] for it in items} == {"euler", "ddim"}, "the SDXL tier's defaults apply"
    store = LocalStore(tmp_path / "bucket")
    job = {"tier": "batch-sdxl", "model": "tiny", "lora": None}
    write_job(store, "batch/j", job, items)

    gen = DiffusersGenerator.from_job(job)
    assert type(gen.pipe).__name__ == "StableDiffusionXLPipeline"
    assert gen.pipe.text_encoder_2 is not None and gen.pipe.tokenizer_2 is not None, "SDXL has two text encoders"
    stats = Worker(store, "batch/j", gen, idle_wait=0.01).run()
    assert stats.items_done == len(items) and stats.images_made == 4

    v = verify(store, "batch/j")
    assert v.ok and v.images_present == 4 and not v.stray_images, v.as_dict()
    it = items[0]
    png = store.get(layout.image_path("batch/j", layout.image_key(it["settings"], it["seeds"][1])))
    img = Image.open(io.BytesIO(png))
    assert img.size == (64, 64) and img.text["prompt"] == "a red cube"
    # Seeds differ, so do the images.
    keys = [layout.image_key(it["settings"], s) for s in it["seeds"]]
    assert len({store.get(layout.image_path("batch/j", k)) for k in keys}) == len(keys)
