"""The Hugging Face token (config.toml [huggingface] token, or HF_TOKEN) is taken where docs/training.md
says, and shown nowhere: `config show` masks it as `hf_…abcd`, and a whole local run with a token
set leaves it in no output, state row, journal object, log or report (issue 46)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sdcloud.cli import main

FILE_TOKEN = "hf_fromconfigtoml0000000000000wxyz"
ENV_TOKEN = "hf_fromenvironment000000000000abcd"


def _config(home, text: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(text)


def test_the_huggingface_section_is_a_known_one_and_a_bad_token_is_one_line_without_its_value(sdcloud_home):
    from sdcloud.errors import UserError
    from sdcloud.runs.inputs.config_check import check_settings

    check_settings({"huggingface": {"token": FILE_TOKEN}})  # docs/training.md's own example: accepted
    with pytest.raises(UserError, match=r"unknown key 'tokn' in \[huggingface\]; known: token"):
        check_settings({"huggingface": {"tokn": FILE_TOKEN}})
    with pytest.raises(UserError, match="must be a string") as bad:
        check_settings({"huggingface": {"token": ""}})
    assert "hf_" not in str(bad.value).replace('"hf_..."', "")


def test_config_show_masks_the_token_and_names_where_it_comes_from(capsys, sdcloud_home, monkeypatch):
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    _config(sdcloud_home, f'[huggingface]\ntoken = "{FILE_TOKEN}"\n\n[infra.extra]\npassword = "p4ssw0rd-long-enough"\n')
    assert main(["config", "show", "--json"]) == 0
    out = capsys.readouterr().out
    shown = json.loads(out)
    assert shown["huggingface.token"] == {"value": "hf_…wxyz", "source": "config.toml [huggingface]"}
    assert FILE_TOKEN not in out and "p4ssw0rd-long-enough" not in out
    monkeypatch.setenv("HF_TOKEN", ENV_TOKEN)  # the environment goes over config.toml
    assert main(["config", "show"]) == 0
    out = capsys.readouterr().out
    assert "hf_…abcd" in out and "HF_TOKEN" in out
    assert ENV_TOKEN not in out and FILE_TOKEN not in out


def test_masked_keeps_the_kind_and_the_last_four_only():
    from sdcloud.config import masked

    assert masked("hf_abcdefghijklmnopqrstuvwxyz") == "hf_…wxyz"
    assert masked("AKIAABCDEFGHIJKLMNOP") == "AKIA…MNOP"
    assert masked("hf_short") == "hf_…"  # too short to show any of it


def _sdcloud(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sdcloud.cli", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **env})


@pytest.mark.slow
def test_a_local_run_with_a_token_set_leaves_it_in_no_output_or_file(sdcloud_home, tmp_path):
    _config(sdcloud_home, f'[huggingface]\ntoken = "{FILE_TOKEN}"\n')
    outputs: list[str] = []

    def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        proc = _sdcloud(*args, env=env or {})
        outputs.extend([proc.stdout, proc.stderr])
        return proc

    # The token only in config.toml: `up` takes it (it used to refuse [huggingface] as unknown).
    up = run("up", "--provider", "local", "--tier", "sd15-lora", "--model", "tiny", "--steps", "4", "--yes", "--json")
    assert up.returncode == 0, up.stderr[-2000:]
    run_id = json.loads(up.stdout)["run"]
    shown_here = run("config", "show", "--json")
    assert json.loads(shown_here.stdout)["huggingface.token"]["value"] == "hf_…wxyz"
    # And with HF_TOKEN as well, every command that shows a run, its log, its costs and the settings.
    env = {"HF_TOKEN": ENV_TOKEN}
    html = tmp_path / "report.html"
    for args in (["status"], ["status", run_id], ["status", run_id, "--json"], ["logs", run_id], ["logs", run_id, "-v"],
                 ["cost", "report", run_id], ["cost", "report", run_id, "--format", "json"],
                 ["cost", "report", "--all", "--format", "csv"], ["cost", "report", run_id, "--format", "html", "-o", str(html)],
                 ["config", "show"], ["config", "show", "--json"],
                 ["pull", run_id, str(tmp_path / "out")]):
        proc = run(*args, env=env)
        assert proc.returncode == 0, (args, proc.stderr[-2000:])
    shown = "\n".join(outputs)
    assert "hf_…abcd" in shown  # config show: which token, masked
    # Every file sdcloud wrote: the state store, the bucket (journal, logs, checkpoints), the reports.
    leaked = []
    for path in [*sdcloud_home.rglob("*"), *tmp_path.rglob("*")]:
        if path.is_file() and path != sdcloud_home / "config.toml":
            data = path.read_bytes()
            leaked += [f"{path}: {t[:6]}" for t in (FILE_TOKEN, ENV_TOKEN) if t.encode() in data]
    leaked += [f"output: {t[:6]}" for t in (FILE_TOKEN, ENV_TOKEN) if t in shown]
    assert not leaked, leaked


def test_config_show_masks_the_wandb_key(capsys, sdcloud_home):
    key = "0123456789abcdef0123456789abcdefwxyz"
    _config(sdcloud_home, f'[wandb]\nkey = "{key}"\n\n[retention]\nkeep_sampled = false\n')
    assert main(["config", "show", "--json"]) == 0
    out = capsys.readouterr().out
    shown = json.loads(out)
    assert shown["wandb.key"]["value"] == "…wxyz" and key not in out
    assert str(shown["retention.keep_sampled"]["value"]).lower() == "false"
