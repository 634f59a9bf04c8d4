"""`batch submit --lora` takes a training run's name as well as its id, and its errors point to
commands that exist (issue 23). No model: the fake generator, and nothing is launched."""

from __future__ import annotations

import hashlib

from sdcloud.cli import main


def _succeeded_run(run_id: str, name: str, lora: bytes) -> None:
    from sdcloud import config
    from sdcloud.runs.inputs.spec import RunSpec
    from sdcloud.runs.records.state import StateStore

    st = StateStore()
    st.create_run(run_id, "sd15-lora", RunSpec(tier="sd15-lora", provider="local").as_dict(), 10, name=name)
    st.update_run(run_id, state="succeeded")
    target = config.home() / "bucket" / "runs" / run_id / "artifacts" / "pytorch_lora_weights.safetensors"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(lora)


def test_lora_by_run_name_is_that_runs_lora(tmp_path):
    from sdcloud.batch.jobs import SubmitOptions, find_job, submit

    _succeeded_run("r-5eed0001", "cats", b"lora weights")
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red cube\n")
    res = submit(SubmitOptions(tier="batch-sd15", model="tiny", prompts=str(prompts), lora="cats", workers=1,
                               provider="local", generator="fake"))
    spec = find_job(res["job"])["spec"]
    assert spec["lora"] == f"r-5eed0001@sha256:{hashlib.sha256(b'lora weights').hexdigest()[:16]}"
    assert spec["lora_key"]


def test_unknown_lora_name_is_one_line_pointing_to_status(capsys, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red cube\n")
    for lora in ("no-such-run", "r-0000dead"):
        rc = main(["batch", "submit", "--tier", "batch-sd15", "--model", "tiny", "--generator", "fake", "--detach",
                   "--prompts", str(prompts), "--lora", lora])
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        assert "see: sdcloud status" in err and "sdcloud list" not in err
    from sdcloud.runs.records.state import StateStore

    assert StateStore().list_runs() == [], "nothing was submitted"
