"""sdcloud infra: the missing-CLI path, the outputs cache, the passphrase, the stack config it sets.

The pulumi CLI cannot be installed here, so the Automation API stack is replaced by a fake where a
test needs one; the stack programs themselves are tested under Pulumi mocks (test_stacks_*.py).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from types import SimpleNamespace

import pytest

from sdcloud.infra import automation as infra
from sdcloud.cli import main
from sdcloud.errors import UserError
from sdcloud.runs.records.state import StateStore

OUTPUTS = {"bucket": "sdcloud-b", "prefix": "sdcloud", "launch_template_id": "lt-1", "subnet_ids": {"us-east-1a": "subnet-1"},
           "security_group_id": "sg-1", "instance_profile_arn": "arn:ip", "role_arn": "arn:role", "key_name": "",
           "region": "us-east-1"}


@pytest.fixture
def no_pulumi(tmp_path, monkeypatch):
    """A PATH with no pulumi on it and a HOME with no ~/.pulumi."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PULUMI_HOME", raising=False)

    def no_network(*a, **k):
        raise AssertionError("looked up the caller's address before the CLI check")

    monkeypatch.setattr(infra, "caller_cidr", no_network)
    import shutil

    assert shutil.which("pulumi") is None


@pytest.mark.parametrize("args", [
    ["infra", "up", "--provider", "aws", "--region", "us-east-1"],
    ["infra", "preview", "--provider", "tencent", "--region", "ap-guangzhou"],
    ["infra", "down", "--provider", "aws", "--region", "us-east-1"],
    ["infra", "outputs", "--provider", "aws", "--region", "us-east-1"],
])
def test_missing_cli_is_one_line_exit_2_and_creates_nothing(no_pulumi, sdcloud_home, capsys, args):
    assert main(args) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.count("\n") == 0
    assert "curl -fsSL https://get.pulumi.com | sh" in err and "https://www.pulumi.com/docs/install/" in err
    assert captured.out == ""
    assert not (sdcloud_home / "pulumi").exists()


def test_missing_cli_on_first_use_from_sdcloud_up(no_pulumi, sdcloud_home):
    with pytest.raises(UserError) as info:
        infra.ensure_infra("aws", "us-west-2")
    assert info.value.exit_code == 2 and "get.pulumi.com" in str(info.value)
    assert not (sdcloud_home / "pulumi").exists()


def test_cli_in_home_pulumi_bin_is_found(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PULUMI_HOME", raising=False)
    cli = tmp_path / "home" / ".pulumi" / "bin" / "pulumi"
    cli.parent.mkdir(parents=True)
    cli.write_text("#!/bin/sh\n")
    cli.chmod(0o755)
    assert infra.pulumi_root() == str(tmp_path / "home" / ".pulumi")


@pytest.mark.parametrize("provider,region", [("gcp", "us-east-1"), ("aws", "US East"), ("aws", "")])
def test_bad_target_is_a_user_error(provider, region):
    with pytest.raises(UserError) as info:
        infra.check_target(provider, region)
    assert info.value.exit_code == 2


def test_cached_outputs_need_no_cli(no_pulumi, sdcloud_home):
    store = StateStore()
    store.save_infra("aws", "us-east-1", OUTPUTS)
    store.close()
    assert infra.ensure_infra("aws", "us-east-1") == OUTPUTS


class FakeStack:
    """Stands in for pulumi.automation.Stack: records config and answers up/preview/destroy/outputs."""

    def __init__(self) -> None:
        self.config: dict = {}
        self.ups = 0
        self.destroyed = False
        self.plugins: list[tuple] = []
        self.removed: list[str] = []
        self.workspace = SimpleNamespace(install_plugin=lambda *a: self.plugins.append(a),
                                         install_plugin_from_server=lambda *a: self.plugins.append(a),
                                         remove_stack=self.removed.append)

    def set_all_config(self, values):
        self.config.update({k: v.value for k, v in values.items()})

    def up(self, on_output=None, color=None):
        self.ups += 1
        if on_output:
            on_output("Updating (us-east-1)\n")
        return SimpleNamespace(outputs={k: SimpleNamespace(value=v, secret=False) for k, v in OUTPUTS.items()})

    def preview(self, on_output=None, color=None):
        return SimpleNamespace(change_summary={"create": 21})

    def destroy(self, on_output=None, color=None):
        self.destroyed = True

    def outputs(self):
        return {k: SimpleNamespace(value=v, secret=False) for k, v in OUTPUTS.items()}


@pytest.fixture
def fake_stack(monkeypatch):
    pytest.importorskip("pulumi")
    stack = FakeStack()
    monkeypatch.setattr(infra, "pulumi_root", lambda: None)
    monkeypatch.setattr(infra, "_stack", lambda provider, region, create=True: stack)
    # The account's own checks (Tencent's SCF_QcsRole, CAM GetRole) have their tests: tests/test_scf_role.py.
    monkeypatch.setattr(infra, "_account_check", lambda provider, region, options: None)
    return stack


def test_first_use_runs_up_once_and_caches(fake_stack, sdcloud_home, tmp_path):
    pub = tmp_path / "me.pub"
    pub.write_text("ssh-ed25519 AAAAC3Nza me@laptop\n")
    opts = infra.InfraOptions(ssh_cidr="198.51.100.4/32", public_key=str(pub), owner_tag="alice")
    lines: list[str] = []
    first = infra.ensure_infra("aws", "us-east-1", opts, on_output=lines.append)
    assert first == OUTPUTS and fake_stack.ups == 1
    assert any("first use" in line for line in lines)
    assert fake_stack.config["aws:region"] == "us-east-1"
    assert fake_stack.config["sdcloud:sshCidr"] == "198.51.100.4/32"
    assert fake_stack.config["sdcloud:publicKey"] == "ssh-ed25519 AAAAC3Nza me@laptop"
    assert fake_stack.config["sdcloud:ownerTag"] == "alice"
    assert fake_stack.config["sdcloud:prefix"] == "sdcloud"
    assert fake_stack.plugins and fake_stack.plugins[0][0] == "aws"
    store = StateStore()
    assert store.infra("aws", "us-east-1") == OUTPUTS
    store.close()
    assert infra.ensure_infra("aws", "us-east-1", opts) == OUTPUTS
    assert fake_stack.ups == 1  # the second call used the cache


def test_tencent_sets_its_region_key_and_plugin_server(fake_stack):
    infra.up("tencent", "ap-guangzhou", infra.InfraOptions(ssh_cidr="", public_key=""))
    assert fake_stack.config["tencentcloud:region"] == "ap-guangzhou"
    assert fake_stack.config["sdcloud:sshCidr"] == ""
    assert fake_stack.plugins[0][0] == "tencentcloud" and fake_stack.plugins[0][2].startswith("github://")


def test_config_toml_infra_table_supplies_defaults(fake_stack, sdcloud_home):
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text('[infra]\nssh_cidr = "192.0.2.9/32"\nprefix = "team"\nroot_volume_gb = 300\n'
                                               '[infra.extra]\ninstanceType = "GN7.2XLARGE32"\n')
    infra.up("tencent", "ap-shanghai", infra.InfraOptions(public_key=""))
    assert fake_stack.config["sdcloud:sshCidr"] == "192.0.2.9/32"
    assert fake_stack.config["sdcloud:prefix"] == "team"
    assert fake_stack.config["sdcloud:rootVolumeGb"] == "300"
    assert fake_stack.config["sdcloud:instanceType"] == "GN7.2XLARGE32"


def test_world_open_ssh_is_refused_before_anything(fake_stack):
    with pytest.raises(UserError, match="whole internet") as info:
        infra.up("aws", "us-east-1", infra.InfraOptions(ssh_cidr="0.0.0.0/0", public_key=""))
    assert info.value.exit_code == 2
    assert fake_stack.ups == 0 and not fake_stack.config


def test_private_key_is_refused(fake_stack, tmp_path):
    key = tmp_path / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nxx\n-----END OPENSSH PRIVATE KEY-----\n")
    with pytest.raises(UserError, match="private key"):
        infra.up("aws", "us-east-1", infra.InfraOptions(ssh_cidr="", public_key=str(key)))


def test_down_destroys_and_forgets_the_cache(fake_stack):
    store = StateStore()
    store.save_infra("aws", "us-east-1", OUTPUTS)
    store.close()
    infra.down("aws", "us-east-1")
    assert fake_stack.destroyed and fake_stack.removed == ["us-east-1"]
    assert infra.cached_outputs("aws", "us-east-1") is None


def test_cli_up_prints_outputs_and_preview_counts(fake_stack, capsys):
    assert main(["infra", "up", "--provider", "aws", "--region", "us-east-1", "--ssh-cidr", "", "--public-key", "",
                 "--set", "maxZones=2", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"launch_template_id": "lt-1"' in out
    assert fake_stack.config["sdcloud:maxZones"] == "2"
    assert main(["infra", "preview", "--provider", "aws", "--region", "us-east-1", "--ssh-cidr", "", "--public-key", ""]) == 0
    assert "create: 21" in capsys.readouterr().out
    assert main(["infra", "up", "--provider", "aws", "--region", "us-east-1", "--set", "novalue"]) == 2


def test_passphrase_is_made_once_private_and_stable(sdcloud_home):
    path = infra.passphrase_file()
    first = path.read_text()
    assert len(first) >= 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert infra.passphrase_file().read_text() == first
    assert path == sdcloud_home / "pulumi" / "passphrase"


def test_stack_program_runs_from_the_stacks_folder_with_its_config(monkeypatch):
    """The inline program infra runs: loads stacks/aws, reads the sdcloud:* config, exports the outputs."""
    pulumi = pytest.importorskip("pulumi")
    pytest.importorskip("pulumi_aws")
    from tests.stacks.test_stacks_aws import Recorder

    mocks = Recorder()
    pulumi.runtime.set_mocks(mocks, project="sdcloud-aws", stack="us-east-1", preview=False)
    pulumi.runtime.set_all_config({"aws:region": "us-east-1", "sdcloud:sshCidr": "198.51.100.4/32",
                                   "sdcloud:prefix": "p1", "sdcloud:rootVolumeGb": "120", "sdcloud:ownerTag": "bob"})
    try:
        @pulumi.runtime.test
        def program():
            infra._program("aws")()

        program()
    finally:
        pulumi.runtime.set_all_config({})
    [sg] = mocks.of_type("ec2/securityGroup:SecurityGroup")
    assert sg["ingress"][0]["cidrBlocks"] == ["198.51.100.4/32"]
    [lt] = mocks.of_type("ec2/launchTemplate:LaunchTemplate")
    assert lt["blockDeviceMappings"][0]["ebs"]["volumeSize"] == 120
    assert lt["tags"]["sdcloud:owner"] == "bob" and lt["tags"]["sdcloud:stack"] == "us-east-1"


def test_help_does_not_import_pulumi():
    code = ("import sys; from sdcloud.cli import main; main(['infra', '--help']); main(['--help']); "
            "sys.stdout.flush(); print('PULUMI' if 'pulumi' in sys.modules else 'CLEAN')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.strip().endswith("CLEAN")


def test_real_workspace_gets_the_file_backend_and_passphrase_file(tmp_path, monkeypatch, sdcloud_home, capsys):
    """Through the real Automation API with a stand-in CLI: what the CLI is handed, and its failure as one line."""
    pytest.importorskip("pulumi")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "cli.log"
    cli = bin_dir / "pulumi"
    cli.write_text('#!/bin/sh\n'
                   'echo "ARGS $* BACKEND=$PULUMI_BACKEND_URL FILE=$PULUMI_CONFIG_PASSPHRASE_FILE '
                   'PASS=$PULUMI_CONFIG_PASSPHRASE" >> "$FAKE_PULUMI_LOG"\n'
                   'if [ "$1" = version ]; then echo v3.200.0; exit 0; fi\n'
                   'echo "error: the stand-in CLI refuses" >&2; exit 255\n')
    cli.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_PULUMI_LOG", str(log))
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "someone-elses")  # must not reach the CLI
    assert main(["infra", "outputs", "--provider", "aws", "--region", "us-east-1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "error: pulumi: error: the stand-in CLI refuses"
    calls = [line for line in log.read_text().splitlines() if "ARGS version" not in line]
    assert calls, "the CLI was not called for the stack"
    passphrase = (sdcloud_home / "pulumi" / "passphrase").read_text()
    for line in calls:
        assert f"BACKEND=file://{sdcloud_home / 'pulumi'} " in line
        assert f"FILE={sdcloud_home / 'pulumi' / 'passphrase'} " in line
        assert passphrase not in line and line.endswith("PASS=")


def test_bad_number_in_config_toml_is_a_user_error(fake_stack, sdcloud_home):
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text('[infra]\nroot_volume_gb = "big"\n')
    with pytest.raises(UserError, match="root_volume_gb") as info:
        infra.up("aws", "us-east-1", infra.InfraOptions(ssh_cidr="", public_key=""))
    assert info.value.exit_code == 2 and fake_stack.ups == 0
