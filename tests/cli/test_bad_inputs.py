"""The new-user bad-input list: each input as a new user types it, each refused before anything is
created: exit 2, one line on stderr, no traceback, no run, job, schedule, host or bucket object.

The list grew from the rounds of trying sdcloud as a new user would (docs/quickstart.md: "Every bad
input gets one line on stderr and exit code 2"); each entry is one input. Inputs that once got
past the checks and launched (the command trainer without its command, an SD1.5 LoRA file on
batch-sd35, `tiny-sd3` for a batch job) are among them. In process, a fresh SDCLOUD_HOME each,
no cloud credentials: fast."""

from __future__ import annotations

import json
import sqlite3
import struct
from pathlib import Path

import pytest

from sdcloud.cli import main


def _files(F: Path) -> None:
    from PIL import Image

    for d in ("empty", "notimages", "broken", "photos", "garbled"):
        (F / d).mkdir()
    (F / "notimages" / "a.exe").write_bytes(b"MZ")
    (F / "broken" / "a.png").write_bytes(b"not a png")
    (F / "garbled" / "a.png").write_bytes(b"not an image")
    Image.new("RGB", (64, 64), (200, 90, 40)).save(F / "photos" / "a.png")
    (F / "bad.yaml").write_text("tier: [sd15-lora\n")
    (F / "unknown.yaml").write_text("tier: sd15-lora\ncolour: blue\n")
    (F / "both.yaml").write_text("tier: sd15-lora\nspot: true\non-demand: true\n")
    (F / "twice.yaml").write_text("tier: sd15-lora\nproviders: [aws, aws]\n")
    (F / "named.yaml").write_text("tier: sd15-lora\nname: r-0badcafe\n")
    (F / "p.txt").write_text("a cat\na dog\n")
    (F / "empty.txt").write_text("\n# nothing\n")
    (F / "bad.jsonl").write_text('{"prompt": "a cat"\n')
    (F / "field.jsonl").write_text('{"prompt": "a cat", "colour": 1}\n')
    (F / "count0.jsonl").write_text('{"prompt": "a cat", "count": 0}\n')
    (F / "w63.jsonl").write_text('{"prompt": "a cat", "width": 63}\n')
    (F / "dup.txt").write_text("a cat\na cat\n")
    (F / "own-samples.yaml").write_text("trainer_args:\n  validation_prompt: a dog\n")
    (F / "neg.jsonl").write_text('{"prompt": "a cat", "seed": -1}\n')
    (F / "sched.jsonl").write_text('{"prompt": "a cat", "scheduler": "magic"}\n')
    (F / "x.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    h = json.dumps({"lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.lora_down.weight":
                    {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}).encode()
    (F / "sd15lora.safetensors").write_bytes(struct.pack("<Q", len(h)) + h)


F = Path("/nonexistent-sdcloud-bad-inputs")  # the files' folder: made once per session (files fixture)
UP = ["up", "--tier", "sd15-lora", "--yes"]
SUB = ["batch", "submit", "--tier", "batch-sd15", "--model", "tiny", "--prompts", str(F / "p.txt")]
SCHED = ["batch", "schedule", "add", "--cron", "0 2 * * *", "--tz", "UTC", "--tier", "batch-sd15", "--model", "tiny",
         "--prompts", str(F / "p.txt")]

SPEEDS = ["speeds", "add", "--gpu", "T4", "--tier", "sdxl-lora"]
OFFERS_TC = ["offers", "--tier", "sdxl-lora", "--provider", "tencent"]
CONF_DIR = "<config.toml a folder>"  # conf: make config.toml a folder instead of writing it
# Secrets as a user might paste them under the wrong key: none may be echoed back (only their masked form).
HF = "hf_" + "Xq7LmN2pR9sT4vW8yZ1bC3dF5gH6jK0"
AKIA = "AKIA" + "Z7Q2M4N6P8R1T3V5"
AKID = "AKID" + "q8Wm3Kx7Lp2Nz5Rt9Vb4Yc6Hd1Jf0Gs"
B64 = "c2VjcmV0LWtleS1tYXRlcmlhbC0xMjM0NTY3ODkwYWJjZGVmZ2hpams="
SECRETS = (HF, AKIA, AKID, B64)

CASES = [
    ("up: unknown tier", ["up", "--tier", "sdxl", "--yes"], None),
    ("up: no tier", ["up", "--yes"], None),
    ("up: spot and on-demand", [*UP, "--spot", "--on-demand"], None),
    ("up: budget 0 ($20 eaten by the shell)", [*UP, "--budget", "0"], None),
    ("up: negative budget", [*UP, "--budget", "-5"], None),
    ("up: budget not a number", [*UP, "--budget", "lots"], None),
    ("up: bad deadline", [*UP, "--deadline", "3x"], None),
    ("up: zero deadline", [*UP, "--deadline", "0"], None),
    ("up: steps 0", [*UP, "--steps", "0"], None),
    ("up: steps negative", [*UP, "--steps", "-1"], None),
    ("up: steps not a number", [*UP, "--steps", "many"], None),
    ("up: checkpoint-every 0", [*UP, "--checkpoint-every", "0"], None),
    ("up: a group on the user's own boxes", [*UP, "--provider", "ssh", "--nodes", "2"], None),
    ("up: misspelt provider", [*UP, "--provider", "locl"], None),
    ("up: unknown provider", [*UP, "--provider", "gcp"], None),
    ("up: dataset missing", [*UP, "--dataset", str(F / "nope")], None),
    ("up: dataset empty", [*UP, "--dataset", str(F / "empty")], None),
    ("up: dataset of no images", [*UP, "--dataset", str(F / "notimages")], None),
    ("up: dataset with a broken image", [*UP, "--dataset", str(F / "broken")], None),
    ("up: model file missing", [*UP, "--model", str(F / "nope.safetensors")], None),
    ("up: model of another family", [*UP, "--model", "tiny-sdxl"], None),
    ("up: model not a checkpoint", [*UP, "--model", str(F / "x.safetensors")], None),
    ("up: unknown trainer", [*UP, "--trainer", "nosuch"], None),
    ("up: unknown builtin flag", [*UP, "--trainer-arg", "nosuch=1"], None),
    ("up: empty sample prompt", [*UP, "--sample-prompt", " "], None),
    ("up: sample-every 0", [*UP, "--sample-prompt", "a cat", "--sample-every", "0"], None),
    ("up: sample-seed negative", [*UP, "--sample-prompt", "a cat", "--sample-seed", "-3"], None),
    ("up: sample-every without a prompt", [*UP, "--sample-every", "100"], None),
    ("up: sample prompt for the command trainer", [*UP, "--trainer", "command", "--trainer-arg", "command=true",
                                                   "--sample-prompt", "a cat"], None),
    ("up: sample prompt beside the trainer's own", [*UP, "-f", str(F / "own-samples.yaml"),
                                                   "--sample-prompt", "a cat"], None),
    ("up: report-to an unknown tracker", [*UP, "--report-to", "mlflow"], None),
    ("up: report-to wandb without a key", [*UP, "--trainer", "kohya", "--dataset", str(F / "photos"),
                                           "--report-to", "wandb"], None),
    ("up: report-to wandb with the builtin trainer", [*UP, "--report-to", "wandb"], '[wandb]\nkey = "k0123456789"\n'),
    ("up: trainer-arg without =", [*UP, "--trainer-arg", "=1"], None),
    ("up: bad builtin value", [*UP, "--trainer-arg", "rank=lots"], None),
    ("up: kohya without a dataset", [*UP, "--trainer", "kohya"], None),
    ("up: diffusers misspelt flag", [*UP, "--trainer", "diffusers", "--dataset", str(F / "photos"),
                                     "--trainer-arg", "instance_prompt=a sks dog",
                                     "--trainer-arg", "lerning_rate=1"], None),
    ("up: diffusers sd3 misspelt flag", ["up", "--tier", "sd35m-dreambooth", "--model", "tiny-sd3", "--yes",
                                         "--trainer", "diffusers", "--trainer-arg", "instance_prompt=a sks toy",
                                         "--dataset", str(F / "photos"),
                                         "--trainer-arg", "weigting_scheme=cosmap"], None),
    ("up: builtin sd3 weighting scheme", ["up", "--tier", "sd35m-lora", "--model", "tiny-sd3", "--yes",
                                          "--trainer-arg", "weighting-scheme=uniform"], None),
    ("up: store ftp", [*UP, "--store", "ftp://x/y"], None),
    ("up: store without bucket", [*UP, "--store", "s3:///p"], None),
    ("up: store bad bucket", [*UP, "--store", "s3://My_Bucket/p"], None),
    ("up: store file relative", [*UP, "--store", "file://x/y"], None),
    ("up: local folder for a cloud host", ["up", "--tier", "sd15-lora", "--provider", "aws", "--store",
                                           "file:///srv/x", "--yes"], None),
    ("up: run file missing", ["up", "-f", str(F / "nope.yaml")], None),
    ("up: run file bad YAML", ["up", "-f", str(F / "bad.yaml")], None),
    ("up: run file unknown field", ["up", "-f", str(F / "unknown.yaml")], None),
    ("up: run file spot and on-demand", ["up", "-f", str(F / "both.yaml")], None),
    ("up: a batch tier", ["up", "--tier", "batch-sd15", "--yes"], None),
    ("up: negative max price", [*UP, "--max-price", "-1"], None),
    ("up: max price not a number", [*UP, "--max-price", "cheap"], None),
    ("up: unknown region", [*UP, "--region", "mars-1"], None),
    ("up: negative simulated preemption", [*UP, "--simulate-preemption", "-5"], None),
    ("up: bad self-end grace", [*UP, "--self-end-grace", "5q"], None),
    ("up: unattended on local", [*UP, "--unattended"], None),
    ("up: unattended on aws with no stack", ["up", "--tier", "sd15-lora", "--provider", "aws", "--unattended", "--yes"], None),
    ("up: aws without credentials", ["up", "--tier", "sd15-lora", "--provider", "aws", "--yes"], None),
    ("up: tencent without credentials", ["up", "--tier", "sd15-lora", "--provider", "tencent", "--yes"], None),
    ("up: ssh without hosts", ["up", "--tier", "sd15-lora", "--provider", "ssh", "--yes"], None),
    ("up: unknown flag", [*UP, "--gpu", "a100"], None),
    ("up: bad config provider", UP, '[defaults]\nprovider = "nope"\n'),
    ("up: config unknown section", UP, "[colours]\nred = 1\n"),
    ("up: config not TOML", UP, "[defaults\n"),
    ("up: config unattended not bool", UP, '[defaults]\nunattended = "yes"\n'),
    ("up: huggingface token not hf_", UP, '[huggingface]\ntoken = 5\n'),
    ("resume: no such run", ["resume", "nosuch"], None),
    ("down: no such run", ["down", "nosuch"], None),
    ("down: no run named", ["down"], None),
    ("status: no such run", ["status", "nosuch"], None),
    ("status: --store without a run", ["status", "--store", "s3://bucket-1/p"], None),
    ("status: --store ftp", ["status", "r-00000000", "--store", "ftp://x/y"], None),
    ("status: --store folder without the run", ["status", "r-00000000", "--store", f"file://{F}/empty"], None),
    ("logs: no such run", ["logs", "nosuch"], None),
    ("logs: negative tail", ["logs", "nosuch", "--tail", "-1"], None),
    ("watch: no such run", ["watch", "nosuch"], None),
    ("pull: no such run", ["pull", "nosuch"], None),
    ("pull: no such run, one step", ["pull", "nosuch", "--step", "20"], None),
    ("pull: step 0", ["pull", "nosuch", "--step", "0"], None),
    ("samples: no such run", ["samples", "nosuch"], None),
    ("samples: step not a number", ["samples", "nosuch", "--step", "last"], None),
    ("shell: no such run", ["shell", "nosuch"], None),
    ("cost report: no such run", ["cost", "report", "nosuch"], None),
    ("cost report: bad --by", ["cost", "report", "--by", "colour"], None),
    ("cost report: bad format", ["cost", "report", "--format", "pdf"], None),
    ("offers: unknown tier", ["offers", "--tier", "sdxl", "--spot"], None),
    ("offers: no tier", ["offers"], None),
    ("offers: unknown provider", ["offers", "--tier", "sdxl-lora", "--provider", "gcp"], None),
    ("offers: negative max price", ["offers", "--tier", "sdxl-lora", "--max-price", "-1"], None),
    ("offers: unknown region", ["offers", "--tier", "sdxl-lora", "--region", "mars-1"], None),
    ("offers: negative limit", ["offers", "--tier", "sdxl-lora", "--limit", "-1"], None),
    ("offers: spot and on-demand", ["offers", "--tier", "sdxl-lora", "--spot", "--on-demand"], None),
    ("catalog refresh: unknown provider", ["catalog", "refresh", "--provider", "gcp"], None),
    ("catalog show: unknown provider", ["catalog", "show", "--provider", "gcp"], None),
    ("tiers: unknown flag", ["tiers", "--bogus"], None),
    ("speeds: unknown tier", ["speeds", "--tier", "sdxl"], None),
    ("batch submit: missing model and prompts", ["batch", "submit", "--tier", "batch-sd15"], None),
    ("batch submit: a training tier", ["batch", "submit", "--tier", "sdxl-lora", "--model", "tiny", "--prompts",
                                       str(F / "p.txt")], None),
    ("batch submit: prompts missing", ["batch", "submit", "--tier", "batch-sd15", "--model", "tiny", "--prompts",
                                       str(F / "nope.txt")], None),
    ("batch submit: prompts empty", ["batch", "submit", "--tier", "batch-sd15", "--model", "tiny", "--prompts",
                                     str(F / "empty.txt")], None),
    ("batch submit: bad JSON", [*SUB[:-1], str(F / "bad.jsonl")], None),
    ("batch submit: unknown field", [*SUB[:-1], str(F / "field.jsonl")], None),
    ("batch submit: count 0", [*SUB[:-1], str(F / "count0.jsonl")], None),
    ("batch submit: width 63", [*SUB[:-1], str(F / "w63.jsonl")], None),
    ("batch submit: duplicate line", [*SUB[:-1], str(F / "dup.txt")], None),
    ("batch submit: negative seed", [*SUB[:-1], str(F / "neg.jsonl")], None),
    ("batch submit: unknown scheduler", [*SUB[:-1], str(F / "sched.jsonl")], None),
    ("batch submit: images-per-prompt 0", [*SUB, "--images-per-prompt", "0"], None),
    ("batch submit: workers 0", [*SUB, "--workers", "0"], None),
    ("batch submit: width not a multiple of 8", [*SUB, "--width", "100"], None),
    ("batch submit: steps 0", [*SUB, "--steps", "0"], None),
    ("batch submit: LoRA run unknown", [*SUB, "--lora", "nosuch"], None),
    ("batch submit: store ftp", [*SUB, "--store", "ftp://x/y"], None),
    ("batch submit: unknown provider", [*SUB, "--provider", "gcp"], None),
    ("batch submit: negative budget", [*SUB, "--budget", "-1"], None),
    ("batch status: no such job", ["batch", "status", "nosuch"], None),
    ("batch cancel: no such job", ["batch", "cancel", "nosuch"], None),
    ("batch pull: no such job", ["batch", "pull", "nosuch"], None),
    ("batch verify: no such job", ["batch", "verify", "nosuch"], None),
    ("batch watch: no such job", ["batch", "watch", "nosuch"], None),
    ("schedule add: bad cron", [*SCHED[:4], "every night", *SCHED[5:]], None),
    ("schedule add: bad zone", [*SCHED[:6], "Mars/Olympus", *SCHED[7:]], None),
    ("schedule add: training tier", [*SCHED[:8], "sd15-lora", *SCHED[9:]], None),
    ("schedule add: prompts missing", [*SCHED[:-1], str(F / "nope.txt")], None),
    ("schedule remove: no such schedule", ["batch", "schedule", "remove", "nosuch"], None),
    ("schedule pause: no such schedule", ["batch", "schedule", "pause", "nosuch"], None),
    ("infra up: unknown provider", ["infra", "up", "--provider", "gcp"], None),
    ("gc: unknown provider", ["gc", "--provider", "gcp"], None),
    ("simulate: trace missing", ["simulate", "--trace", str(F / "nope.csv"), "--job-hours", "4"], None),
    ("simulate: negative job hours", ["simulate", "--job-hours", "-4"], None),
    ("up: garbled image", [*UP, "--dataset", str(F / "garbled")], None),
    ("up: kohya misspelt flag", [*UP, "--trainer", "kohya", "--dataset", str(F / "photos"),
                                 "--trainer-arg", "network_dimm=8"], None),
    ("up: command trainer without a command", [*UP, "--trainer", "command"], None),
    ("batch submit: sd3 tier, sd15 LoRA file", ["batch", "submit", "--tier", "batch-sd35", "--model", "tiny",
                                               "--prompts", str(F / "p.txt"), "--lora", str(F / "sd15lora.safetensors")], None),
    ("batch submit: LoRA file empty", [*SUB, "--lora", str(F / "x.safetensors")], None),
    ("batch submit: tiny-sd3 on batch-sd15", ["batch", "submit", "--tier", "batch-sd15", "--model", "tiny-sd3",
                                             "--prompts", str(F / "p.txt")], None),
    ("batch submit: deadline bad", [*SUB, "--deadline", "soon"], None),
    ("batch submit: max-failed-boots 0", [*SUB, "--max-failed-boots", "0"], None),
    ("pull: bad destination (a file)", ["pull", "nosuch", str(F / "p.txt")], None),
    ("config: hf token in [defaults]", UP, '[defaults]\ntoken = "hf_abc"\n'),
    ("config show: unknown key", ["config", "show"], '[defaults]\nzone = "x"\n'),
    ("unknown command", ["nosuchcommand"], None),
    # issue 53: absurd or impossible figures
    ("speeds add: rate 1e-300", [*SPEEDS, "--rate", "1e-300"], None),
    ("speeds add: rate 1e308", [*SPEEDS, "--rate", "1e308"], None),
    ("speeds add: 5000 steps/s on a T4", [*SPEEDS, "--rate", "5000"], None),
    ("speeds add: 1000x the model's figure", ["speeds", "add", "--gpu", "H100", "--tier", "sd15-lora", "--rate", "5000"], None),
    ("speeds add: a tier the GPU cannot fit", ["speeds", "add", "--gpu", "T4", "--tier", "sdxl-dreambooth", "--rate", "0.1"],
     None),
    ("speeds add: 5000 steps/s SD1.5 on a T4, forced", ["speeds", "add", "--gpu", "T4", "--tier", "sd15-lora", "--rate",
                                                         "5000", "--force"], None),
    ("speeds add: 1e-300 forced", ["speeds", "add", "--gpu", "T4", "--tier", "sd15-lora", "--rate", "1e-300", "--force"],
     None),
    ("speeds add: rate nan", [*SPEEDS, "--rate", "nan"], None),
    ("speeds add: note with a newline", [*SPEEDS[:-1], "sd15-lora", "--rate", "0.9", "--note", "a\nb"], None),
    ("speeds add: note with an escape", [*SPEEDS[:-1], "sd15-lora", "--rate", "0.9", "--note", "\x1b[2Jgone"], None),
    # currency
    ("offers tencent: cny_per_usd nan", OFFERS_TC, "[currency]\ncny_per_usd = nan\n"),
    ("offers tencent: cny_per_usd inf", OFFERS_TC, "[currency]\ncny_per_usd = inf\n"),
    ("offers tencent: cny_per_usd 0", OFFERS_TC, "[currency]\ncny_per_usd = 0\n"),
    ("offers: unknown key in [currency]", ["offers", "--tier", "sdxl-lora"], "[currency]\nusd_per_eur = 1.1\n"),
    ("offers: [currency] not a table", ["offers", "--tier", "sdxl-lora"], "currency = 7\n"),
    # provider lists
    ("up: provider repeated", [*UP, "--provider", "aws,aws"], None),
    ("up: provider list ends in a comma", [*UP, "--provider", "aws,"], None),
    ("up: provider list starts with a comma", [*UP, "--provider", ",aws"], None),
    ("up: provider repeated in another case", [*UP, "--provider", "aws,AWS"], None),
    ("up: config providers with an empty item", UP, '[defaults]\nproviders = ["aws", ""]\n'),
    ("up: config providers repeated", UP, '[defaults]\nproviders = "aws,aws"\n'),
    ("batch submit: provider repeated", [*SUB, "--provider", "aws,aws"], None),
    ("batch submit: provider list ends in a comma", [*SUB, "--provider", "aws,"], None),
    ("offers: provider repeated", ["offers", "--tier", "sdxl-lora", "--provider", "aws,aws"], None),
    ("offers: provider list starts with a comma", ["offers", "--tier", "sdxl-lora", "--provider", ",aws"], None),
    ("up: run file providers repeated", ["up", "-f", str(F / "twice.yaml"), "--yes"], None),
    ("up: run file name like a run id", ["up", "-f", str(F / "named.yaml"), "--yes"], None),
    # names
    ("batch submit: name with an escape", [*SUB, "--name", "\x1b[2Jx"], None),
    ("batch submit: name with a newline", [*SUB, "--name", "a\nb"], None),
    ("batch submit: name a path", [*SUB, "--name", "../../x"], None),
    ("batch submit: empty name", [*SUB, "--name", ""], None),
    ("batch submit: 300-character name", [*SUB, "--name", "x" * 300], None),
    ("batch submit: name like a job id", [*SUB, "--name", "b-1234abcd"], None),
    ("batch submit: name like a run id", [*SUB, "--name", "r-1234abcd"], None),
    ("up: name like a run id", [*UP, "--name", "r-1234abcd"], None),
    ("up: name like a job id", [*UP, "--name", "b-00000000"], None),
    ("up: empty name", [*UP, "--name", ""], None),
    ("up: name with an escape", [*UP, "--name", "\x1b[31mred"], None),
    ("schedule add: name with an escape", [*SCHED, "--name", "\x1b[2Jx"], None),
    # config files
    ("up: config.toml a folder", UP, CONF_DIR),
    ("up: config.toml not UTF-8", UP, b"[defaults]\nprovider = \"\xff\xfe\"\n"),
    ("offers: config.toml a folder", ["offers", "--tier", "sdxl-lora"], CONF_DIR),
    # a secret pasted under another key: refused, never echoed
    ("up: token as the provider", UP, f'[defaults]\nprovider = "{HF}"\n'),
    ("up: token as the region", [*UP, "--provider", "aws"], f'[defaults]\nregion = "{HF}"\n'),
    ("up: AWS key as the tier", ["up", "--yes"], f'[defaults]\ntier = "{AKIA}"\n'),
    ("up: Tencent key as the provider", UP, f'[defaults]\nprovider = "{AKID}"\n'),
    ("up: base64 secret as the region", [*UP, "--provider", "aws"], f'[defaults]\nregion = "{B64}"\n'),
    ("up: token as the unattended flag", UP, f'[defaults]\nunattended = "{HF}"\n'),
    ("offers: token as cny_per_usd", OFFERS_TC, f'[currency]\ncny_per_usd = "{HF}"\n'),
    ("up: token as --provider", [*UP, "--provider", HF], None),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bad-input-files")
    _files(folder)
    return folder


def _created(home: Path) -> list[str]:
    out = []
    for db, tables in (("state.db", ("runs", "attempts", "speeds")), ("schedules.db", ("schedules",))):
        if (home / db).exists():
            con = sqlite3.connect(home / db)
            for table in tables:
                try:
                    if con.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]:
                        out.append(table)
                except sqlite3.Error:
                    pass
            con.close()
    for sub in ("bucket", "local/instances", "local/hosts", "pulumi"):
        if (home / sub).exists() and any(p.is_file() for p in (home / sub).rglob("*")):
            out.append(sub)
    return out


@pytest.mark.parametrize("what, argv, conf", CASES, ids=[c[0] for c in CASES])
def test_a_bad_input_is_one_line_exit_2_and_nothing_created(capsys, sdcloud_home, files, monkeypatch, tmp_path,
                                                            what, argv, conf):
    monkeypatch.setenv("HOME", str(tmp_path / "user-home"))  # no ~/.tencentcloud, ~/.ssh of the developer's
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    if conf == CONF_DIR:
        (sdcloud_home / "config.toml").mkdir()
    elif isinstance(conf, bytes):
        (sdcloud_home / "config.toml").write_bytes(conf)
    elif conf is not None:
        (sdcloud_home / "config.toml").write_text(conf)
    args = [a.replace(str(F), str(files)) for a in argv]
    capsys.readouterr()
    code = main(args)
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (what, code, err[-2000:])
    assert "Traceback" not in err
    assert not any(secret in out + err for secret in SECRETS), (what, err)
    assert "\x1b" not in err and "\r" not in err, (what, err)  # terminal escapes never printed raw
    assert _created(sdcloud_home) == [], what
