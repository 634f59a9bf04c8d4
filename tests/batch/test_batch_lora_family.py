"""`batch submit --lora RUN`: the run's LoRA is of the family the batch tier renders with (issue 46).
An SD1.5 run's LoRA on batch-sd35 loads into no layer of SD3.5's transformer: the images came out
as without it and `verify` said ok. Now: exit 2, one line naming both families and the tier to use,
nothing recorded, nothing written to the bucket."""

from __future__ import annotations

import pytest

from sdcloud.cli import main


def _run(run_id: str, tier: str) -> None:
    """A succeeded training run of `tier` with its LoRA artifact in this machine's bucket."""
    from sdcloud import config
    from sdcloud.runs.inputs.spec import RunSpec
    from sdcloud.runs.records.state import StateStore

    st = StateStore()
    st.create_run(run_id, tier, RunSpec(tier=tier, provider="local").as_dict(), 10)
    st.update_run(run_id, state="succeeded")
    target = config.home() / "bucket" / "runs" / run_id / "artifacts" / "pytorch_lora_weights.safetensors"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"lora")


def _submit(tmp_path, tier: str, lora: str) -> int:
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red cube\n")
    return main(["batch", "submit", "--tier", tier, "--model", "tiny", "--generator", "fake", "--detach",
                 "--prompts", str(prompts), "--lora", lora])


@pytest.mark.parametrize("run_tier, batch_tier, fitting", [
    ("sd15-lora", "batch-sd35", "batch-sd15"),
    ("sdxl-lora", "batch-sd15", "batch-sdxl"),
    ("sd35m-lora", "batch-sdxl", "batch-sd35"),
])
def test_a_lora_of_another_family_than_the_batch_tier_is_refused_and_nothing_recorded(
        capsys, tmp_path, sdcloud_home, run_tier, batch_tier, fitting):
    from sdcloud.runs.records.state import StateStore

    _run("r-10ra0001", run_tier)
    assert _submit(tmp_path, batch_tier, "r-10ra0001") == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "run r-10ra0001 trained an" in err and f"but {batch_tier} renders with" in err and f"--tier {fitting}" in err
    assert not [r for r in StateStore().list_runs() if r["spec"].get("kind") == "batch"], "nothing was submitted"
    assert not (sdcloud_home / "bucket" / "batch").exists(), "nothing was written to the bucket"


def test_a_lora_of_the_tier_s_family_is_taken(capsys, tmp_path, sdcloud_home):
    from sdcloud.batch.submit import resolve_lora_run

    _run("r-10ra0002", "sd15-lora")
    assert resolve_lora_run("r-10ra0002", "batch-sd15").run_id == "r-10ra0002"
