"""The mainland network profile: Tencent's mainland China regions get Tencent's PyPI mirror, a hub
mirror and trainer sources through the run's bucket by default; config.toml and the run file
override each; the control plane carries the trainer sources into the bucket and a mainland host
never fetches them with git."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from sdcloud.errors import UserError
from sdcloud.runs.driving.hostboot import cloud_user_data
from sdcloud.providers.tencent.network import MAINLAND
from sdcloud.runs.inputs.network import host_network, profile
from sdcloud_agent import network, scripts
from sdcloud_agent.store import LocalStore

KOHYA = scripts.pins()["kohya"][1]


def _agent_config(user_data: str) -> dict:
    start = user_data.index("<<'SDCLOUD_CONFIG'\n") + len("<<'SDCLOUD_CONFIG'\n")
    return json.loads(user_data[start:user_data.index("\nSDCLOUD_CONFIG\n", start)])


def _tencent(region: str, **agent) -> dict:
    return {"run_id": "r", "store": {"url": "cos://b-1250000000/p", "region": region}, **agent}


def fake_kohya_archive(path: Path, commit: str = KOHYA, url: str = "https://github.com/kohya-ss/sd-scripts") -> Path:
    """A small archive shaped like the one a host packs: kohya-<sha12>/ with .sdcloud-source."""
    name = f"kohya-{commit[:12]}"
    src = path.parent / "src" / name
    src.mkdir(parents=True)
    (src / "train_network.py").write_text("print('fake sd-scripts')\n")
    (src / "requirements.txt").write_text("")
    (src / ".sdcloud-source").write_text(f"{url} {commit} {commit}\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        tar.add(src, arcname=name)
    return path


def test_mainland_tencent_regions_get_the_profile_and_others_do_not(sdcloud_home, tmp_path):
    store = LocalStore(tmp_path / "bucket")
    for region in ("ap-guangzhou", "ap-shanghai", "ap-beijing", "ap-chengdu", "ap-nanjing"):
        assert profile("tencent", region)[0] == "mainland"
        cfg = _agent_config(cloud_user_data("tencent", store, _tencent(region), {"region": region}))
        assert cfg["network"] == MAINLAND
    assert MAINLAND["pip_index_url"] == "https://mirrors.cloud.tencent.com/pypi/simple"
    assert MAINLAND["hf_endpoint"] == "https://hf-mirror.com" and MAINLAND["trainer_sources"] == "bucket"
    for provider, region in (("tencent", "ap-singapore"), ("tencent", "ap-hongkong"), ("aws", "us-east-1")):
        assert profile(provider, region) == ("global", {})
    cfg = _agent_config(cloud_user_data("tencent", store, _tencent("ap-singapore"), {"region": "ap-singapore"}))
    assert "network" not in cfg


def test_config_toml_and_the_run_file_override_each_default(sdcloud_home, tmp_path):
    from sdcloud.runs.driving.controller import agent_config
    from sdcloud.runs.inputs.spec import build_spec

    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text(
        '[network.regions."ap-guangzhou"]\npip_index_url = "http://mirrors.tencentyun.com/pypi/simple"\n'
        'hf_endpoint = ""\n')
    net = host_network("ap-guangzhou", "tencent")
    # The VPC-internal name; "" puts the hub back to the public one.
    assert net == {"pip_index_url": "http://mirrors.tencentyun.com/pypi/simple", "trainer_sources": "bucket"}
    assert host_network("ap-shanghai", "tencent") == MAINLAND  # another region keeps the profile
    run = tmp_path / "run.yaml"
    run.write_text("tier: sd15-lora\nprovider: tencent\nregion: ap-guangzhou\n"
                   "network:\n  hf_endpoint: https://hub.mine.example\n  trainer_sources: git\n")
    spec = build_spec(str(run), {})
    agent = agent_config(spec, "r1", 1, 10, {"url": "cos://b-1250000000/p", "region": "ap-guangzhou"})
    cfg = _agent_config(cloud_user_data("tencent", LocalStore(tmp_path / "bucket"), agent, {"region": "ap-guangzhou"}))
    assert cfg["network"] == {"pip_index_url": "http://mirrors.tencentyun.com/pypi/simple",
                              "hf_endpoint": "https://hub.mine.example", "trainer_sources": "git"}
    # pip is told to trust a plain-http mirror.
    env: dict[str, str] = {}
    network.apply(cfg["network"], env)
    assert env["PIP_TRUSTED_HOST"] == "mirrors.tencentyun.com" and "trainer_sources" not in str(env)


@pytest.mark.parametrize("body, needle", [
    ("network:\n  apt: https://x\n", "no setting 'apt'"),
    ("network:\n  hf_endpoint: hf-mirror.com\n", "http(s) URL"),
    ("network:\n  trainer_sources: github\n", "trainer_sources must be one of git, bucket"),
])
def test_a_bad_run_network_is_one_line_exit_2_nothing_created(sdcloud_home, tmp_path, capsys, body, needle):
    from sdcloud.cli import main

    run = tmp_path / "run.yaml"
    run.write_text("tier: sd15-lora\n" + body)
    capsys.readouterr()
    code = main(["up", "-f", str(run)])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and err.count("\n") == 1, err
    assert not (sdcloud_home / "local" / "hosts").exists()


def test_the_control_plane_carries_kohya_sources_into_the_bucket(sdcloud_home, tmp_path):
    from sdcloud.runs.inputs.carry import cache_dir

    store = LocalStore(tmp_path / "bucket")
    agent = _tencent("ap-guangzhou", trainer="kohya", trainer_args={"network_module": "networks.lora"})
    key = f"cache/trainers/kohya-{KOHYA[:12]}.tar"
    # Neither in the bucket nor here, and git cannot reach the (refused) source: one line naming the path.
    agent_bad = {**agent, "trainer_sources": {"kohya_url": str(tmp_path / "no-such-repo")}}
    with pytest.raises(UserError, match=f"put its archive at .*kohya-{KOHYA[:12]}.tar"):
        cloud_user_data("tencent", store, agent_bad, {"region": "ap-guangzhou"})
    assert store.head(key) is None
    # The archive in the local cache: uploaded whole, no .part left.
    fake_kohya_archive(cache_dir() / f"kohya-{KOHYA[:12]}.tar")
    cloud_user_data("tencent", store, agent, {"region": "ap-guangzhou"})
    assert store.head(key) is not None and not [o for o in store.list("cache/") if o.key.endswith(".part")]
    from sdcloud.runs.inputs.carry import carry_trainer_sources

    assert carry_trainer_sources(store, agent) == "present"
    # Outside the mainland profile nothing is carried (the host fetches and caches it itself).
    other = LocalStore(tmp_path / "bucket2")
    cloud_user_data("tencent", other, _tencent("ap-singapore", trainer="kohya"), {"region": "ap-singapore"})
    assert other.head(key) is None


def test_the_control_plane_packs_the_pinned_tree_with_git_when_it_has_no_archive(sdcloud_home, tmp_path):
    """This machine reaches the source (a local repository standing in for GitHub): the tree is
    packed as a host would, kept in the local cache and uploaded."""
    repo = tmp_path / "sd-scripts"
    repo.mkdir()
    (repo / "train_network.py").write_text("print('x')\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "-C", str(repo), "add", "."], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "x"], check=True)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    store = LocalStore(tmp_path / "bucket")
    agent = _tencent("ap-beijing", trainer="kohya", trainer_sources={"kohya_url": str(repo), "kohya_commit": commit})
    from sdcloud.runs.inputs.carry import cache_dir, carry_trainer_sources

    assert carry_trainer_sources(store, agent) == "uploaded"
    assert (cache_dir() / f"kohya-{commit[:12]}.tar").is_file()
    assert store.head(f"cache/trainers/kohya-{commit[:12]}.tar") is not None


def test_a_bucket_only_host_restores_the_carried_tree_and_never_runs_git(tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "bucket")
    a = scripts.archive("kohya")
    monkeypatch.setattr(scripts, "fetch", lambda *a, **k: pytest.fail("a bucket-only host ran git"))
    with pytest.raises(scripts.SourceError, match="bucket has no cache/trainers/kohya-.*bucket only"):
        scripts._tree(store, tmp_path / "host", a.name, a.url, a.ref, a.what, bucket_only=True)
    store.put_file(a.key, fake_kohya_archive(tmp_path / "carried" / f"{a.name}.tar"))
    tree, how, commit = scripts._tree(store, tmp_path / "host", a.name, a.url, a.ref, a.what, bucket_only=True)
    assert how == "restored" and commit == KOHYA and (tree / "train_network.py").is_file()


def test_torch_comes_from_the_package_index_when_its_wheel_is_the_hosts_build(monkeypatch):
    """PyPI's own Linux wheel of the pinned torch is its CUDA 13.0 build (the wheel's metadata
    requires cuda-toolkit 13.0.3): a cu130 host (driver >= 580) takes torch from the package index,
    so a mainland host needs only the PyPI mirror; a cu126 host (an older driver) still needs torch's
    per-CUDA index, and a run's torch_index_url wins over the package index."""
    from sdcloud_agent import boot, gpu

    monkeypatch.delenv("SDCLOUD_TORCH_INDEX_URL", raising=False)
    assert boot.torch_install_args("cpu") == [boot.TORCH_PIN]
    assert boot.torch_install_args(boot.PYPI_TORCH_BUILD) == [boot.TORCH_PIN]
    assert boot.PYPI_TORCH_BUILD in [tag for _, tag in gpu.TORCH_CUDA_BUILDS]
    assert boot.torch_install_args("cu126") == [boot.TORCH_PIN, "--index-url", gpu.TORCH_INDEX + "cu126"]
    env: dict[str, str] = {}
    network.apply({"torch_index_url": "https://torch.mirror.example/whl/"}, env)
    monkeypatch.setenv("SDCLOUD_TORCH_INDEX_URL", env["SDCLOUD_TORCH_INDEX_URL"])
    assert boot.torch_install_args("cu130") == [boot.TORCH_PIN, "--index-url", "https://torch.mirror.example/whl/cu130"]
    # The mainland profile names no torch index: torch follows pip_index_url, Tencent's PyPI mirror.
    assert "torch_index_url" not in MAINLAND


def test_the_diffusers_examples_torchvision_comes_from_where_torch_came_from():
    """A torch from the package index (PyPI's cu130 wheel carries no local label) takes its
    torchvision from the package index too, so a mainland host needs only the PyPI mirror; a
    `+cu130` torch, from torch's own index, takes the pair from there."""
    from sdcloud_agent import gpu

    text = scripts.examples_lock()
    assert scripts.examples_plan(text, "cu130", "2.13.0")[0] == [next(
        ln.split("#", 1)[0].strip() for ln in text.splitlines() if ln.startswith("torchvision=="))]
    assert scripts.examples_plan(text, "cu130", "2.13.0+cu130")[0][-1] == gpu.TORCH_INDEX + "cu130"
    assert scripts.examples_plan(text, "cu126", "2.13.0+cu126")[0][-1] == gpu.TORCH_INDEX + "cu126"
