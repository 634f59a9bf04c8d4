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


def _lora_file(path, names: list[str]):
    """A header-only safetensors file with these tensor names (what the check reads)."""
    import json
    import struct

    header = json.dumps({n: {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for n in names}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    return str(path)


SD15_KEYS = ["lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.lora_down.weight",
             "lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight"]
SDXL_KEYS = ["unet.down_blocks.1.attentions.0.transformer_blocks.1.attn1.to_q.lora_A.weight",
             "lora_te2_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight"]
SD3_KEYS = ["transformer.transformer_blocks.0.attn.to_q.lora_A.weight"]


@pytest.mark.parametrize("keys, batch_tier, needle", [
    (SD15_KEYS, "batch-sd35", "an sd15 LoRA (by its tensor names), but batch-sd35 renders with sd3; use --tier batch-sd15"),
    (SDXL_KEYS, "batch-sd15", "an sdxl LoRA (by its tensor names), but batch-sd15 renders with sd15; use --tier batch-sdxl"),
    (SD3_KEYS, "batch-sdxl", "an sd3 LoRA (by its tensor names), but batch-sdxl renders with sdxl; use --tier batch-sd35"),
    ([], "batch-sd15", "the file holds no tensors, so no LoRA"),
])
def test_a_lora_file_of_another_family_is_refused_and_nothing_recorded(capsys, tmp_path, sdcloud_home, keys,
                                                                       batch_tier, needle):
    """A file's family is told by its tensor names: an SD1.5 LoRA file on batch-sd35 was taken, and
    its workers rendered without it."""
    from sdcloud.runs.records.state import StateStore

    lora = _lora_file(tmp_path / "mine.safetensors", keys)
    assert _submit(tmp_path, batch_tier, lora) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err, err
    assert not StateStore().list_runs() and not (sdcloud_home / "bucket" / "batch").exists()


@pytest.mark.parametrize("keys, family", [(SD15_KEYS, "sd15"), (SDXL_KEYS, "sdxl"), (SD3_KEYS, "sd3"),
                                          (["something.else"], None)])
def test_a_lora_files_family_from_its_names(keys, family):
    from sdcloud.batch.lora_file import family_of

    assert family_of(keys) == family


def test_a_lora_file_of_the_tiers_family_passes(tmp_path):
    from sdcloud.batch.lora_file import check_lora_file

    check_lora_file(_lora_file(tmp_path / "a.safetensors", SD3_KEYS), "batch-sd35", "sd3", {})
    check_lora_file(_lora_file(tmp_path / "b.safetensors", ["x.y"]), "batch-sd35", "sd3", {})  # unknown: the load decides


def test_a_file_that_is_no_safetensors_is_refused_in_one_line(tmp_path):
    from sdcloud.batch.lora_file import check_lora_file
    from sdcloud.errors import UserError

    bogus = tmp_path / "style.safetensors"
    bogus.write_bytes(b"not really a LoRA at all")
    with pytest.raises(UserError) as exc:
        check_lora_file(str(bogus), "batch-sd15", "sd15", {})
    assert str(exc.value).startswith(f"--lora {bogus}: not a safetensors file (header of ")
    assert str(exc.value).count(str(bogus)) == 1


@pytest.mark.parametrize("model, tier, refused", [("tiny-sd3", "batch-sd35", None), ("tiny-sdxl", "batch-sdxl", None),
                                                  ("tiny-sd3", "batch-sd15", "is an sd3 model but tier batch-sd15")])
def test_a_tiny_model_named_by_its_family_is_the_tiers_tiny(tmp_path, sdcloud_home, model, tier, refused):
    """`--model tiny-sd3` passed the checks and every worker then looked for it on the hub."""
    from sdcloud.batch.jobs import SubmitOptions, validate
    from sdcloud.errors import UserError

    prompts = tmp_path / "p.txt"
    prompts.write_text("a red cube\n")
    opts = SubmitOptions(tier=tier, model=model, prompts=str(prompts), provider="local")
    if refused:
        with pytest.raises(UserError, match=refused):
            validate(opts)
    else:
        validate(opts)
        assert opts.model == "tiny"
