"""A pulled batch job says what made its images: the model and the LoRA, in index.jsonl and in the
gallery (issue 23). No model: the fake generator, one in-process worker."""

from __future__ import annotations

import json
from pathlib import Path

from sdcloud.cli import main


def _job(tmp_path: Path, lora: str | None) -> str:
    from tests.support.fake_batch import FakeGenerator
    from sdcloud_agent.batch.worker import Worker

    from sdcloud.batch.jobs import SubmitOptions, find_job, submit
    from sdcloud.runs.records.store import open_run_store

    prompts = tmp_path / "p.txt"
    prompts.write_text("a red cube\n")
    res = submit(SubmitOptions(tier="batch-sd15", model="tiny", prompts=str(prompts), lora=lora, images_per_prompt=2,
                               workers=1, provider="local", generator="fake"))
    spec = find_job(res["job"])["spec"]
    Worker(open_run_store(spec["store"]), spec["prefix"], FakeGenerator(), idle_wait=0.01).run()
    return res["job"]


def _pull(job: str, out: Path) -> tuple[list[dict], str]:
    assert main(["batch", "pull", job, str(out)]) == 0
    lines = [json.loads(ln) for ln in (out / "index.jsonl").read_text().splitlines()]
    return lines, (out / "index.html").read_text()


def test_index_and_gallery_name_the_model_and_the_lora(tmp_path):
    from sdcloud.batch.jobs import lora_identity

    lora = tmp_path / "style.safetensors"
    from tests.batch.test_batch_lora_family import SD15_KEYS, _lora_file

    _lora_file(lora, SD15_KEYS)  # names only (an SD1.5 LoRA's): the fake generator does not load it
    ident = lora_identity(str(lora))
    lines, page = _pull(_job(tmp_path, str(lora)), tmp_path / "with-lora")
    assert len(lines) == 2 and {(ln["model"], ln["lora"]) for ln in lines} == {("tiny", ident)}
    assert page.count(f"tiny + LoRA {ident}") == 3  # the page's header and each of the two tiles

    lines, page = _pull(_job(tmp_path, None), tmp_path / "plain")
    assert {(ln["model"], ln["lora"]) for ln in lines} == {("tiny", None)} and "tiny, no LoRA" in page


def test_lines_of_an_older_worker_take_the_model_and_lora_from_their_item(tmp_path, monkeypatch):
    from sdcloud_agent.batch.worker import Worker

    made = Worker._line

    def older(self, *args, **kwargs):  # a worker of an sdcloud from before the model was recorded
        ln = made(self, *args, **kwargs)
        ln.pop("model"), ln.pop("lora")
        return ln

    monkeypatch.setattr(Worker, "_line", older)
    lines, page = _pull(_job(tmp_path, None), tmp_path / "out")
    assert {(ln["model"], ln["lora"]) for ln in lines} == {("tiny", None)} and "tiny, no LoRA" in page
