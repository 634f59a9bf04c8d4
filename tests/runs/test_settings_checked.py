"""Every setting that can be checked is checked before a run or a batch job is recorded (issue 39):
the tier's kind against the command, every config.toml section and key, the network settings on
every provider, --region on a provider without regions, and `logs --attempt` beyond the last.
Each refusal is one line on stderr, exit 2, and nothing recorded. Fast: nothing trains here."""

from __future__ import annotations

import pytest

from sdcloud.cli import main
from tests.support.harness_cli import nothing_recorded, refused

from tests.support import ROOT

# Each section sdcloud reads: a good key with a bad value (the words the refusal must carry), and
# the section's name for an unknown key in it.
BAD_VALUES = [
    ("defaults", 'provider = "moon"', "must be one of"),
    ("defaults", 'tier = "sd99"', "must be a tier"),
    ("defaults", 'unattended = "perhaps"', "true or false"),
    ("currency", "cny_per_usd = -7", "above 0"),
    ("local", 'price_per_hour = "cheap"', "number"),
    ("local", "notice_seconds = -1", "0 or more"),
    ("hosts", 'self_end_grace = "abc"', "duration such as"),
    ("catalog", 'max_age_days = "week"', "number"),
    ("infra", 'root_volume_gb = "big"', "whole number"),
    ("infra", 'ssh_cidr = "everyone"', "address range"),
    ("infra", "prefix = 7", "string"),
    ("infra", "extra = 3", "table"),
    ("huggingface", "token = 7", "string"),
    ("wandb", "key = 7", "string"),
    ("retention", 'keep_sampled = "sometimes"', "true or false"),
    ("aws", "spot_discount = 1.5", "up to (not including) 1"),
    ("tencent", 'site = "mars"', "china or international"),
    ("tencent", "spot_discount = -0.1", "from 0"),
    ("vast", "api_key = 7", "Vast.ai API key"),
    ("vast", 'bid_margin = "high"', "number"),
    ("network", 'pip_index_url = "ftp://mirror.example/simple"', "http(s) URL"),
    ("network", 'trainer_sources = "usb"', "git, bucket"),
    ('network.regions."ap-guangzhou"', 'hf_endpoint = "hf-mirror.com"', "http(s) URL"),
]


def _sections() -> list[str]:
    from sdcloud.runs.inputs.config_check import known_keys

    return sorted([*known_keys(), "network"])


def test_every_section_has_a_bad_value_case():
    """A section added to config.toml's checks without a case here fails this test."""
    covered = {section.split(".")[0] for section, _, _ in BAD_VALUES}
    assert covered == set(_sections())


@pytest.fixture
def prompts(tmp_path):
    p = tmp_path / "prompts.txt"
    p.write_text("a red fox\na blue whale\n")
    return p


@pytest.mark.parametrize("section,line,needle", BAD_VALUES, ids=[f"{s}:{line.split()[0]}" for s, line, _ in BAD_VALUES])
def test_a_bad_value_in_each_section_refuses_up_and_batch_submit(capsys, sdcloud_home, dataset, prompts,
                                                                  section, line, needle):
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text(f"[{section}]\n{line}\n")
    err = refused(capsys, ["up", "--tier", "sd15-lora", "--dataset", str(dataset), "--steps", "2"], needle)
    assert section.split(".")[0].split('"')[0] in err  # the refusal names where the value is
    refused(capsys, ["batch", "submit", "--tier", "batch-sd15", "--model", "tiny", "--prompts", str(prompts),
                      "--generator", "fake"], needle)
    nothing_recorded()


@pytest.mark.parametrize("section", _sections())
def test_an_unknown_key_in_each_section_is_named(capsys, sdcloud_home, dataset, section):
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text(f"[{section}]\ncolour = \"blue\"\n")
    err = refused(capsys, ["up", "--tier", "sd15-lora", "--dataset", str(dataset), "--steps", "2"], "colour")
    assert f"[{section}]" in err
    nothing_recorded()


def test_an_unknown_section_and_a_section_that_is_not_a_table(capsys, sdcloud_home, dataset):
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text("[gpu]\nfast = true\n")
    refused(capsys, ["up", "--tier", "sd15-lora", "--dataset", str(dataset)], "unknown section [gpu]")
    (sdcloud_home / "config.toml").write_text('network = "cn"\n')
    refused(capsys, ["up", "--tier", "sd15-lora", "--dataset", str(dataset)], "[network] must be a table")
    nothing_recorded()


def test_a_good_config_with_every_section_is_accepted():
    from sdcloud.runs.inputs.config_check import check_settings

    check_settings({
        "defaults": {"provider": "local", "tier": "sd15-lora", "unattended": False},
        "currency": {"cny_per_usd": 7.2}, "local": {"price_per_hour": 0.5, "notice_seconds": 5},
        "hosts": {"self_end_grace": "5m"}, "catalog": {"max_age_days": 30},
        "infra": {"prefix": "team", "ssh_cidr": "", "root_volume_gb": 300, "extra": {"instanceType": "g5.xlarge"}},
        "aws": {"spot_discount": 0.7}, "tencent": {"site": "china", "spot_discount": 0.6},
        "network": {"pip_index_url": "https://pypi.mirror.example/simple",
                    "regions": {"ap-guangzhou": {"hf_endpoint": ""}}},
    })


def test_the_run_files_network_is_checked_on_this_machine_too(capsys, sdcloud_home, dataset, tmp_path):
    for body, needle in (("network:\n  pip_index_url: ftp://mirror.example/simple\n", "http(s) URL"),
                         ("network:\n  hub: https://x\n", "no setting 'hub'"),
                         ("network: cn\n", "must be a mapping")):
        run = tmp_path / "run.yaml"
        run.write_text(f"tier: sd15-lora\nsteps: 2\ndataset: {dataset}\n{body}")
        refused(capsys, ["up", "-f", str(run)], needle)
    nothing_recorded()


def test_up_refuses_a_batch_tier_and_batch_submit_a_training_tier(capsys, sdcloud_home, dataset, prompts):
    err = refused(capsys, ["up", "--tier", "batch-sd15", "--dataset", str(dataset)], "batch submit --tier batch-sd15")
    assert "does not train" in err
    refused(capsys, ["batch", "submit", "--tier", "sd15-lora", "--model", "tiny", "--prompts", str(prompts)],
             "not a batch tier")
    nothing_recorded()


def test_region_on_a_provider_without_regions_isrefused(capsys, sdcloud_home, dataset):
    from sdcloud.providers.traits import names, traits

    without = [n for n in names() if not traits(n).default_region]
    assert "local" in without
    err = refused(capsys, ["up", "--tier", "sd15-lora", "--dataset", str(dataset), "--region", "us-east-1"],
                   "has no regions")
    assert "--region us-east-1" in err
    nothing_recorded()


@pytest.mark.parametrize("provider", ["aws", "tencent"])
def test_a_region_the_catalog_does_not_know_is_refused_before_credentials_are_asked_for(
        capsys, sdcloud_home, dataset, monkeypatch, provider):
    # No keys here: the region is what is wrong, so the refusal names it (and the regions there are),
    # before sdcloud asks for credentials or makes a stack in a region that does not exist.
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "TENCENTCLOUD_SECRET_ID",
                "TENCENTCLOUD_SECRET_KEY"):
        monkeypatch.delenv(var, raising=False)
    err = refused(capsys, ["up", "--tier", "sd15-lora", "--dataset", str(dataset), "--provider", provider,
                            "--region", "mars-1", "--yes"], f"unknown region 'mars-1' for {provider}; known: ")
    assert "credentials" not in err
    nothing_recorded()


def test_logs_attempt_beyond_the_last_isrefused(capsys, sdcloud_home):
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    state.create_run("r-0123abcd", "sd15-lora", {"provider": "local", "tier": "sd15-lora"}, 10)
    for n in (1, 2):
        state.add_attempt("r-0123abcd", n, "local", f"t{n}", region="local")
    state.update_run("r-0123abcd", state="stopped")
    assert main(["logs", "r-0123abcd", "--attempt", "2"]) == 0
    capsys.readouterr()
    err = refused(capsys, ["logs", "r-0123abcd", "--attempt", "9"], "attempts 1 to 2")
    assert "--attempt 9" in err
    refused(capsys, ["logs", "r-0123abcd", "--attempt", "0"], "attempts 1 to 2")


def test_the_readme_lists_every_section_with_a_link_to_its_reference():
    import re

    from sdcloud.runs.inputs.config_check import known_keys

    root = ROOT
    readme = (root / "README.md").read_text()
    block = readme[readme.index("### Settings (`config.toml`)"):]
    block = block[:block.index("\n## ")]
    rows = [line for line in block.splitlines() if line.startswith("| `[")]
    for section, keys in {**known_keys(), "network": {}}.items():
        row = next((r for r in rows if f"`[{section}]`" in r), None)
        assert row is not None, f"[{section}] is not in the README's settings table"
        for key in keys:
            assert f"`{key}`" in row, (section, key)
        for target, anchor in re.findall(r"\]\(([^)#]+)#([^)]+)\)", row):
            doc = (root / target).read_text()
            slugs = {re.sub(r"[^\w\- ]", "", h.strip("# ").lower()).replace(" ", "-")
                     for h in doc.splitlines() if h.startswith("#")}
            assert anchor in slugs, f"{target}#{anchor}: no such heading"
