"""Everything checkable is checked before launch: trainer flags against the trainer's own parser,
store URLs, a budget that cannot pay for one look at the host, a deadline shorter than the
estimate, batch settings against the model. Each refusal: exit 2, one line on stderr, no run row
in the state store and no host."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from sdcloud.cli import main
from sdcloud.errors import UserError

from tests.support import ROOT


def _runs() -> list[dict]:
    from sdcloud.runs.records.state import StateStore

    return StateStore().list_runs()


def refused(capsys, home: Path, args: list[str]) -> str:
    """Run the CLI; assert exit 2, one stderr line, nothing created. Returns the line."""
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert "Traceback" not in err
    assert _runs() == []
    assert not (home / "local" / "instances").exists() or not list((home / "local" / "instances").iterdir())
    assert not (home / "bucket").exists() or not any((home / "bucket").rglob("*"))
    return err


@pytest.fixture
def dataset(tmp_path) -> Path:
    from PIL import Image

    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(2):
        Image.new("RGB", (64, 64), (i * 90, 40, 200)).save(folder / f"{i}.png")
    return folder


UP = ["up", "--tier", "sd15-lora", "--model", "tiny", "--steps", "3", "--provider", "local"]


# -- trainer flags -------------------------------------------------------------------------------

@pytest.mark.parametrize("arg, needle", [
    ("nosuch=1", "the builtin trainer has no flag --nosuch"),
    ("badformat", "the builtin trainer has no flag --badformat"),
    ("learning_rate=1e-4", "no flag --learning-rate"),  # its flags use dashes (the adapter turns _ into -)
    ("lr_schedular=cosine", "did you mean --lr-scheduler"),
    ("lr=fast", "invalid float value: 'fast'"),
    ("mode=textual-inversion", "invalid choice: 'textual-inversion'"),
    ("resolution=100", "--resolution must be a multiple of 8"),
])
def test_builtin_trainer_flags_are_checked_by_its_own_parser(capsys, sdcloud_home, arg, needle):
    err = refused(capsys, sdcloud_home, [*UP, "--trainer-arg", arg])
    assert needle in err


def test_builtin_flags_the_parser_takes_pass(sdcloud_home):
    from sdcloud.runs.inputs.spec import build_spec

    spec = build_spec(None, {"tier": "sd15-lora", "model": "tiny", "steps": 3,
                             "trainer_arg": ["lr=0.001", "rank=8", "no-buckets", "seed=3", "lr-sched=cosine"]}).spec
    assert spec.trainer_args["lr"] == "0.001" and spec.trainer_args["no-buckets"] is True


def test_kohya_flags_are_checked_against_the_pinned_sd_scripts(capsys, sdcloud_home, dataset):
    base = [*UP, "--trainer", "kohya", "--dataset", str(dataset)]
    err = refused(capsys, sdcloud_home, [*base, "--trainer-arg", "learning-rate=1e-4"])
    assert "train_network.py has no flag --learning-rate; did you mean --learning_rate" in err
    assert "sd-scripts v0.10.1" in err
    err = refused(capsys, sdcloud_home, [*base, "--trainer-arg", "gradient_checkpointing=1"])
    assert "--gradient_checkpointing takes no value" in err
    err = refused(capsys, sdcloud_home, [*base, "--trainer-arg", "network_dim=eight"])
    assert "--network_dim must be a whole number, got 'eight'" in err
    # A LoRA tier's flags on a full fine-tune script: every one of them is named, the first in words.
    err = refused(capsys, sdcloud_home, [*base, "--trainer-arg", "script=sdxl_train.py"])
    assert "sdxl_train.py has no flag --network_module (a default of tier sd15-lora: pick a script for lora)" in err


def test_diffusers_flags_are_checked_against_the_example_script(capsys, sdcloud_home, dataset):
    base = [*UP, "--trainer", "diffusers", "--dataset", str(dataset), "--trainer-arg", "instance_prompt=a sks dog"]
    err = refused(capsys, sdcloud_home, [*base, "--trainer-arg", "nosuch=1"])
    assert "train_dreambooth_lora.py has no flag --nosuch" in err
    err = refused(capsys, sdcloud_home, [*base, "--trainer-arg", "mixed_precision=fp8"])
    assert "--mixed_precision must be one of no, fp16, bf16, got 'fp8'" in err


def test_every_tier_default_passes_its_trainer_check(sdcloud_home):
    """The flags sdcloud itself adds (runs/inputs/training.py) are in the pinned scripts' tables."""
    from sdcloud.offers.tiers import all_tiers
    from sdcloud.runs.inputs.preflight import check_script_args
    from sdcloud.runs.inputs.spec import RunSpec

    tiers = [t for t in all_tiers().values() if t.kind == "train"]
    assert tiers
    for tier in tiers:
        for trainer, extra in (("kohya", {}), ("diffusers", {"instance_prompt": "a sks dog"})):
            spec = RunSpec(tier=tier.name, trainer=trainer, trainer_args=dict(extra), dataset="/d", model="m")
            check_script_args(spec, tier)  # raises on a flag the script would refuse


def test_the_options_table_names_its_sources():
    from sdcloud_agent.trainers import options

    table = options.table()
    pins = (ROOT / "bootstrap/sdcloud_agent/data/trainer-sources.txt").read_text()
    assert table["kohya"]["commit"] in pins  # the very commit the hosts fetch
    assert table["kohya"]["source"] == "https://github.com/kohya-ss/sd-scripts"
    assert len(table["diffusers"]["commit"]) == 40 and table["diffusers"]["source"].endswith("huggingface/diffusers")
    assert "--network_module" in options.script_options("kohya", "train_network.py")
    # add_training_arguments(parser, support_dreambooth): its DreamBooth flags only where asked for.
    assert "--prior_loss_weight" in options.script_options("kohya", "train_db.py")
    assert "--prior_loss_weight" not in options.script_options("kohya", "sdxl_train.py")
    assert options.script_options("kohya", "/abs/own_script.py") is None


def test_resume_applies_the_same_check(capsys, sdcloud_home):
    from sdcloud.runs.inputs.spec import build_spec
    from sdcloud.runs.records.state import StateStore

    spec = build_spec(None, {"tier": "sd15-lora", "model": "tiny", "steps": 3}).as_dict()
    spec["trainer_args"] = ["--nosuch", "1"]  # as a run launched before this check stored it
    state = StateStore()
    state.create_run("r-0000beef", "sd15-lora", spec, 3, name="old")
    state.update_run("r-0000beef", state="failed", reason="trainer exited 2")
    for args in (["resume", "old"], ["up", "--name", "old"]):
        code = main(args)
        out, err = capsys.readouterr()
        assert code == 2 and err.count("\n") == 1 and "no flag --nosuch" in err, err
        run = state.get_run("r-0000beef")
        assert run["state"] == "failed" and state.attempts("r-0000beef") == []


def test_the_extractor_follows_calls_and_binds_constant_arguments(tmp_path):
    from sdcloud.runs.inputs.trainer_options_build import Extractor

    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "__init__.py").write_text("")
    (tmp_path / "library" / "util.py").write_text(textwrap.dedent("""
        def add_training(parser, dreambooth: bool):
            parser.add_argument("--steps", type=int)
            if dreambooth:
                parser.add_argument("--prior_loss_weight", type=float)
            else:
                parser.add_argument("--fine_tune_only", action="store_true")
    """))
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import argparse
        from library import util
        def setup_parser():
            parser = argparse.ArgumentParser()
            util.add_training(parser, False)
            parser.add_argument("--mode", choices=["a", "b"], nargs="*")
            return parser
    """))
    opts = Extractor(tmp_path).options(tmp_path / "train.py", "setup_parser")
    assert opts == {"--fine_tune_only": "flag", "--mode": "str:a|b*", "--steps": "int"}


# -- store URLs ----------------------------------------------------------------------------------

@pytest.mark.parametrize("url, needle", [
    ("ftp://x/y", "unsupported store URL"),
    ("file://x/y", "needs an absolute path"),
    ("s3:///prefix", "no bucket"),
    ("s3://My_Bucket/p", "is not a bucket name"),
])
def test_a_bad_store_url_creates_nothing(capsys, sdcloud_home, url, needle):
    err = refused(capsys, sdcloud_home, [*UP, "--store", url])
    assert needle in err and url in err


def test_a_folder_on_this_machine_is_refused_for_a_cloud_host(capsys, sdcloud_home):
    err = refused(capsys, sdcloud_home, ["up", "--tier", "sd15-lora", "--provider", "aws", "--store", "file:///srv/x", "--yes"])
    assert "a aws host cannot reach a folder on this machine" in err


def test_store_forms_the_store_opens_pass(tmp_path):
    from sdcloud.runs.inputs.preflight import check_store_url

    assert check_store_url("s3://bucket-1/runs") == "s3://bucket-1/runs"
    assert check_store_url("cos://sdcloud-1250000000/p", "tencent") == "cos://sdcloud-1250000000/p"
    assert check_store_url("file:///srv/sdcloud") == "file:///srv/sdcloud"
    assert check_store_url(str(tmp_path / "b")) == (tmp_path / "b").resolve().as_uri()


# -- budget and deadline on this machine ---------------------------------------------------------

def test_a_budget_below_two_polls_of_the_cheapest_host_is_refused(capsys, sdcloud_home):
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text("[local]\nprice_per_hour = 0.5\n")
    err = refused(capsys, sdcloud_home, [*UP, "--budget", "0.00001"])
    # 0.5 $/h x 2 polls x 1 s = $0.000278
    assert "--budget $0.00001 is below two polls (1 s each)" in err
    assert "this-machine at $0.5/h: $0.00027778" in err and "--budget 0.000278" in err


@pytest.fixture
def cpu_only(monkeypatch):
    """This machine as a CPU box, whatever the test runs on (its GPU would give another estimate)."""
    monkeypatch.setattr("sdcloud.providers.local.provider._local_gpu", lambda: ("CPU", 0, 0.0))


def test_a_free_host_takes_any_budget(sdcloud_home, cpu_only):
    from sdcloud.offers.tiers import get_tier
    from sdcloud.providers import get_provider
    from sdcloud.runs.inputs.preflight import check_own_hosts
    from sdcloud.runs.inputs.spec import build_spec

    spec = build_spec(None, {"tier": "sd15-lora", "model": "tiny", "steps": 3, "budget": "0.00001"}).spec
    tier = get_tier("sd15-lora")
    check_own_hosts(spec, tier, 3, get_provider("local").offers(tier, "spot"))  # price 0: nothing to refuse


def test_a_deadline_shorter_than_the_estimate_is_refused(capsys, sdcloud_home):
    err = refused(capsys, sdcloud_home, ["up", "--tier", "sd15-lora", "--model", "tiny", "--steps", "2000",
                                         "--deadline", "1m"])
    assert "--deadline 1.0 min is shorter than the estimate on the fastest offer: 33.3 min" in err
    assert "2000 steps at 1 s a step" in err


def test_a_deadline_that_fits_passes(sdcloud_home, cpu_only):
    from sdcloud.offers.tiers import get_tier
    from sdcloud.providers import get_provider
    from sdcloud.runs.inputs.preflight import check_own_hosts
    from sdcloud.runs.inputs.spec import build_spec

    tier = get_tier("sd15-lora")
    offers = get_provider("local").offers(tier, "spot")
    spec = build_spec(None, {"tier": "sd15-lora", "model": "tiny", "steps": 30, "deadline_hours": "1m"}).spec
    check_own_hosts(spec, tier, 30, offers)  # 30 s of paced steps within a minute
    spec = build_spec(None, {"tier": "sd15-lora", "model": "tiny", "steps": 300, "deadline_hours": "1m",
                             "trainer_arg": ["min-step-seconds=0"]}).spec
    check_own_hosts(spec, tier, 300, offers)  # unpaced: no estimate to hold it to
    with pytest.raises(UserError, match="4.0 min for 120 steps at 2 s a step"):
        check_own_hosts(build_spec(None, {"tier": "sd15-lora", "model": "tiny", "steps": 120, "deadline_hours": "3m",
                                          "trainer_arg": ["min-step-seconds=2"]}).spec, tier, 120, offers)


def test_an_ssh_host_with_a_known_gpu_is_held_to_the_optimizers_estimate(sdcloud_home, cpu_only):
    import dataclasses

    from sdcloud.offers.optimizer import Offer, job_hours
    from sdcloud.offers.tiers import get_tier
    from sdcloud.providers import get_provider
    from sdcloud.runs.inputs.preflight import check_own_hosts
    from sdcloud.runs.inputs.spec import build_spec

    tier = get_tier("sd15-lora")
    row = dataclasses.replace(get_provider("local").offers(tier, "spot")[0].row, provider="ssh", gpu="T4",
                              instance_type="box1", gpu_count=1)
    offers = [Offer(row, "on-demand")]
    spec = build_spec(None, {"tier": "sd15-lora", "provider": "ssh", "model": "org/some-sd15", "steps": 1500,
                             "deadline_hours": "10m"}).spec
    hours = job_hours(tier, row, 1500, 1)
    assert hours > 10 / 60
    with pytest.raises(UserError,
                       match=r"10.0 min is shorter than the estimate on the fastest offer: .* for 1500 steps on box1 \(T4\)"):
        check_own_hosts(spec, tier, 1500, offers)
    spec.deadline_hours = hours * 1.01
    check_own_hosts(spec, tier, 1500, offers)


# -- batch settings against the model --------------------------------------------------------------

BATCH = ["batch", "submit", "--tier", "batch-sd15", "--model", "tiny", "--generator", "fake"]


@pytest.fixture
def plain_prompts(tmp_path) -> Path:
    p = tmp_path / "prompts.txt"
    p.write_text("a red fox\na blue bird\n")
    return p


def _items(prompts: Path, **flags) -> list[dict]:
    from sdcloud.batch import jobs

    opts = jobs.SubmitOptions(tier="batch-sd15", model=flags.pop("model", "tiny"), prompts=str(prompts),
                              generator="fake", **flags)
    return jobs.validate(opts)


def test_a_plain_prompts_file_on_the_tiny_model_uses_its_small_defaults(plain_prompts):
    settings = [it["settings"] for it in _items(plain_prompts)]
    assert {(s["width"], s["height"], s["steps"]) for s in settings} == {(64, 64, 2)}
    # Another model keeps Stable Diffusion's.
    real = _items(plain_prompts, model="org/some-sd15")[0]["settings"]
    assert (real["width"], real["height"], real["steps"]) == (512, 512, 30)


def test_width_height_and_steps_flags_set_a_plain_file_and_a_jsonl_line_still_wins(tmp_path, plain_prompts):
    settings = _items(plain_prompts, width=96, height=128, steps=3)[0]["settings"]
    assert (settings["width"], settings["height"], settings["steps"]) == (96, 128, 3)
    jl = tmp_path / "p.jsonl"
    jl.write_text(json.dumps({"prompt": "a cat", "steps": 4}) + "\n" + json.dumps({"prompt": "a dog"}) + "\n")
    got = [(it["settings"]["width"], it["settings"]["steps"]) for it in _items(jl, width=96, steps=3)]
    assert got == [(96, 4), (96, 3)]


@pytest.mark.parametrize("extra, needle", [
    (["--width", "100"], "--width for the tiny model: width must be an integer from 32 to 512, a multiple of 8, got 100"),
    (["--steps", "500"], "--steps for the tiny model: steps must be an integer from 1 to 50, got 500"),
    (["--model", "org/sd15", "--height", "4096"], "--height for Stable Diffusion: height must be an integer from 64 to 2048"),
    (["--store", "ftp://x/y"], "--store ftp://x/y: unsupported store URL"),
])
def test_bad_batch_settings_are_refused_before_anything_is_written(capsys, sdcloud_home, plain_prompts, extra, needle):
    err = refused(capsys, sdcloud_home, [*BATCH, "--prompts", str(plain_prompts), *extra])
    assert needle in err


def test_a_jsonl_line_too_big_for_the_tiny_model_is_refused(capsys, sdcloud_home, tmp_path):
    jl = tmp_path / "p.jsonl"
    jl.write_text(json.dumps({"prompt": "a cat", "width": 1024}) + "\n")
    err = refused(capsys, sdcloud_home, [*BATCH, "--prompts", str(jl)])
    assert "p.jsonl line 1: width must be an integer from 32 to 512" in err


@pytest.mark.slow
def test_the_submit_line_states_the_settings_and_where_they_came_from(capsys, sdcloud_home, plain_prompts):
    code = main([*BATCH, "--prompts", str(plain_prompts), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    res = json.loads(out)
    line = f"{res['job']}: 2 images at 64x64 px, 2 steps (the tiny model's defaults where the file gives none; " \
           "set them with --width/--height/--steps)"
    assert line in err and res["settings"] in line
    code = main([*BATCH, "--prompts", str(plain_prompts), "--steps", "1", "--name", "second"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert ": 2 images at 64x64 px, 1 step (the tiny model's defaults where the file gives none; " \
           "set them with --width/--height)" in err


def test_an_off_switch_reaches_the_builtin_trainer_as_its_no_flag(sdcloud_home):
    """`--trainer-arg buckets=false` (docs/training.md) was left out of the command, so the
    trainer's default (buckets on for SDXL) won; every on/off flag of the parser is negatable."""
    from sdcloud.offers.tiers import get_tier
    from sdcloud.runs.inputs.preflight import _builtin_argv, _raising_parser
    from sdcloud.runs.inputs.spec import build_spec
    from sdcloud_agent.trainers.builtin_adapter import NEGATABLE

    spec = build_spec(None, {"tier": "sdxl-lora", "model": "tiny-sdxl", "steps": 3,
                             "trainer_arg": ["buckets=false", "gradient_checkpointing=false"]}).spec
    argv = _builtin_argv(spec, get_tier("sdxl-lora"), 3)
    assert "--no-buckets" in argv and "--no-gradient-checkpointing" in argv
    import argparse

    parser = _raising_parser()
    negatable = {a.dest.replace("_", "-") for a in parser._actions if isinstance(a, argparse.BooleanOptionalAction)}
    assert negatable == set(NEGATABLE)
