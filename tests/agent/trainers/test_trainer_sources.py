"""External trainers put on the host when chosen (sdcloud_agent/scripts.py), through real agents
against SeaweedFS over HTTPS, with no network: kohya sd-scripts from a local git repository at a
pinned commit (a fake sd-scripts tree whose network scripts are tests/support/fake_kohya.py), installed into
its own venv with the real pip (its requirements are satisfied offline by the training
environment), cached in the bucket and restored by the next host; the diffusers examples from the
tag of the installed diffusers, with a venv of their own for their lock (here a local wheel in
place of torchvision and friends), cached and restored the same way. The trainer is started by
absolute paths only."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from sdcloud_agent import boot, gpu, scripts
from sdcloud_agent.store import open_store
from sdcloud_agent.trainers.base import Context
from sdcloud_agent.trainers.diffusers import DiffusersTrainer
from sdcloud_agent.trainers.kohya import KohyaTrainer

from tests.support import SUPPORT

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}


def _git_repo(path: Path, files: dict[str, str], tag: str | None = None) -> str:
    """A git repository holding `files` in one commit (after a first one, so that a shallow fetch
    by commit has history to skip); its commit sha."""
    env = {**os.environ, **GIT_ENV}
    run = lambda *a: subprocess.run(["git", *a], cwd=path, env=env, check=True, capture_output=True, text=True)
    path.mkdir(parents=True)
    run("init", "-q")
    (path / "README.md").write_text("first\n")
    run("add", "-A")
    run("commit", "-qm", "first")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    run("add", "-A")
    run("commit", "-qm", "the trainer")
    if tag:
        run("tag", "-a", tag, "-m", tag)
    return run("rev-parse", "HEAD").stdout.strip()


def _shadow_wheel(folder: Path) -> Path:
    """A wheel of `shellingham` 0.0.1 on local disk: a package the training environment has at another
    version (as kohya pins transformers 4.x against our 5.x), installable with no network."""
    import zipfile

    folder.mkdir()
    whl = folder / "shellingham-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("shellingham.py", "__version__ = '0.0.1'\n")
        zf.writestr("shellingham-0.0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: shellingham\nVersion: 0.0.1\n")
        zf.writestr("shellingham-0.0.1.dist-info/WHEEL",
                    "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("shellingham-0.0.1.dist-info/RECORD", "")
    return whl


def _probe_wheel(folder: Path) -> Path:
    """A wheel of `sdcloud-examples-probe` on local disk, standing in for the examples' lock
    (torchvision, datasets, ...) that a test cannot install: no network."""
    import zipfile

    folder.mkdir()
    whl = folder / "sdcloud_examples_probe-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("examples_probe.py", "VERSION = '0.0.1'\n")
        zf.writestr("sdcloud_examples_probe-0.0.1.dist-info/METADATA",
                    "Metadata-Version: 2.1\nName: sdcloud-examples-probe\nVersion: 0.0.1\n")
        zf.writestr("sdcloud_examples_probe-0.0.1.dist-info/WHEEL",
                    "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("sdcloud_examples_probe-0.0.1.dist-info/RECORD", "")
    return whl


def _kohya_repo(path: Path, shadow: Path | None = None) -> str:
    fake = (SUPPORT / "fake_kohya.py").read_text()
    # The script says which interpreter runs it, that sd-scripts' own package imports, and which shellingham it sees.
    script = fake.replace("from __future__ import annotations\n", "from __future__ import annotations\n"
                          "import sys as _sys\nimport library as _library\nimport shellingham as _shadow\n"
                          "print('KOHYA_PREFIX', _sys.prefix, _library.__file__, flush=True)\n"
                          "print('KOHYA_SHADOW', _shadow.__version__, flush=True)\n", 1)
    accelerate = importlib.metadata.version("accelerate")
    own = f"shellingham @ {shadow.as_uri()}\n" if shadow else ""
    return _git_repo(path, {
        "sdxl_train_network.py": script, "train_network.py": script,
        "library/__init__.py": "",
        "setup.py": 'from setuptools import setup, find_packages\n\nsetup(name="library", packages=find_packages())\n',
        # Pins as upstream writes them, here ones the training environment already satisfies (no network).
        "requirements.txt": f"accelerate=={accelerate}\n{own}# for kohya_ss library\n-e .\n"})


def _diffusers_repo(path: Path, tag: str) -> str:
    script = ("import sys\n"
              "from tests.support.fake_host import fake_external\n"  # the checkout on PYTHONPATH (conftest)

              "import diffusers, examples_probe\n"
              "print('DIFFUSERS_PREFIX', sys.prefix, flush=True)\n"
              "print('DIFFUSERS_LAYERS', diffusers.__file__, examples_probe.__file__, flush=True)\n"
              "sys.exit(fake_external('diffusers', sys.argv[1:]))\n")
    return _git_repo(path, {"examples/dreambooth/train_dreambooth_lora_sdxl.py": script,
                            "examples/dreambooth/requirements_sdxl.txt": "accelerate>=0.16.0\n",
                            "src/diffusers/__init__.py": ""}, tag=tag)


def _images(folder: Path, n: int) -> Path:
    from PIL import Image

    folder.mkdir(parents=True)
    for i in range(n):
        Image.new("RGB", (40, 32), (50 * i, 20, 200)).save(folder / f"{i}.png")
    return folder


def _store_cfg(seaweed, bucket: str) -> dict:
    return {"url": f"s3://{bucket}/sdcloud", "endpoint_url": seaweed.endpoint, "region": "us-east-1"}


def _agent(tmp: Path, name: str, store_cfg: dict, trainer: str, trainer_args: dict, sources: dict,
           **extra) -> tuple[int, str, Path]:
    """One agent on a fresh host (its own working and boot folders), as the user-data starts it;
    (exit code, its log, its working folder)."""
    work = tmp / f"work-{name}"
    boot = tmp / f"boot-{name}"
    boot.mkdir()
    cfg = {"run_id": f"r-{name}", "attempt": 1, "trainer": trainer, "trainer_args": trainer_args,
           "model": str(tmp / "model"), "steps": 4, "checkpoint_every": 2, "store": store_cfg,
           "metadata": {"kind": "none"}, "workdir": str(work), "nvme": False, "require_gpu": False,
           "heartbeat_seconds": 0.5, "trainer_sources": sources, **extra}
    path = tmp / f"agent-{name}.json"
    path.write_text(json.dumps(cfg))
    env = {**os.environ, "SDCLOUD_BOOT_DIR": str(boot), "FAKE_STEP_SECONDS": "0.02", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "sdcloud_agent", "run", "--config", str(path)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    log = work / "attempt-1.log"
    return proc.returncode, (log.read_text(errors="replace") if log.exists() else proc.stderr), work


def _phases(store, run_id: str) -> dict:
    doc = json.loads(store.get(f"runs/{run_id}/boot/attempt-1.json"))
    return {p["name"]: p for p in doc["phases"]}


def _trainer_command(log: str) -> list[str]:
    line = next(ln for ln in log.splitlines() if "starting trainer: " in ln)
    return line.split("starting trainer: ", 1)[1].split()


def test_kohya_is_fetched_at_its_commit_into_its_own_venv_then_restored_by_the_next_host(tmp_path, seaweed, s3_env):
    repo = tmp_path / "sd-scripts"
    sha = _kohya_repo(repo, shadow=_shadow_wheel(tmp_path / "wheels"))
    store_cfg = _store_cfg(seaweed, "trainer-sources-kohya")
    store = open_store(store_cfg)
    store.ensure_bucket()
    (tmp_path / "model").mkdir()
    data = _images(tmp_path / "photos", 2)
    args = {"network_module": "networks.lora", "resolution": "512,512"}
    sources = {"kohya_url": repo.as_uri(), "kohya_commit": sha}

    rc, log, work = _agent(tmp_path, "cold", store_cfg, "kohya", args, sources, dataset=str(data))
    assert rc == 0, log[-4000:]
    ph = _phases(store, "r-cold")
    assert ph["trainer"]["result"] == "fetched", ph
    assert list(ph) == ["model", "trainer", "dataset", "checkpoint", "first-step"]
    keys = [o.key for o in store.list("cache/trainers/")]
    assert f"cache/trainers/kohya-{sha[:12]}.tar" in keys, keys
    assert [k for k in keys if k.startswith(f"cache/trainers/kohya-venv-{sha[:12]}-")], keys
    assert not [k for k in keys if k.endswith(".part")]
    # Absolute paths only: the venv's python runs accelerate, the script is in the fetched tree.
    cmd = _trainer_command(log)
    tree = work / "trainers" / f"kohya-{sha[:12]}"
    venv = next((work / "trainers").glob(f"kohya-venv-{sha[:12]}-*"))
    assert cmd[:4] == [str(venv / "bin" / "python"), "-m", "accelerate.commands.launch",
                       str(tree / "sdxl_train_network.py")], cmd
    assert "accelerate" not in [Path(c).name for c in cmd[:1]] and all(os.path.isabs(c) for c in (cmd[0], cmd[3]))
    assert f"KOHYA_PREFIX {venv} {tree}/library/__init__.py" in log, log[-3000:]
    assert (tree / ".sdcloud-source").read_text().split()[-1] == sha
    # The real pip ran in the venv, on kohya's requirements less `-e .`; our accelerate satisfied its pin.
    assert "pip install -r requirements.txt" in log and "pip: Requirement already satisfied: accelerate==" in log, log
    # Its own pin shadows ours inside its venv; the training environment keeps its version.
    assert "KOHYA_SHADOW 0.0.1" in log and importlib.metadata.version("shellingham") != "0.0.1"
    assert json.loads(store.get("runs/r-cold/status.json"))["phase"] == "succeeded"
    assert store.head("runs/r-cold/artifacts/sdcloud.safetensors") is not None

    # The next host: a fresh working folder, and no way to fetch (the repository is gone).
    shutil.rmtree(repo)
    rc, log, work2 = _agent(tmp_path, "warm", store_cfg, "kohya", args, sources, dataset=str(data))
    assert rc == 0, log[-4000:]
    assert _phases(store, "r-warm")["trainer"]["result"] == "restored"
    venv2 = next((work2 / "trainers").glob(f"kohya-venv-{sha[:12]}-*"))
    assert f"KOHYA_PREFIX {venv2} {work2}/trainers/kohya-{sha[:12]}/library/__init__.py" in log, log[-3000:]
    assert "pip install" not in log and "KOHYA_SHADOW 0.0.1" in log


def test_a_kohya_commit_the_repository_does_not_have_fails_the_trainer_phase(tmp_path, seaweed, s3_env):
    repo = tmp_path / "sd-scripts"
    _kohya_repo(repo)
    store_cfg = _store_cfg(seaweed, "trainer-sources-bad")
    store = open_store(store_cfg)
    store.ensure_bucket()
    (tmp_path / "model").mkdir()
    wrong = "0123456789abcdef0123456789abcdef01234567"
    rc, log, _ = _agent(tmp_path, "bad", store_cfg, "kohya", {"network_module": "networks.lora"},
                        {"kohya_url": repo.as_uri(), "kohya_commit": wrong}, dataset=str(_images(tmp_path / "p", 1)))
    assert rc == 1, log[-3000:]
    status = json.loads(store.get("runs/r-bad/status.json"))
    assert status["phase"] == "failed" and status["boot_phase"] == "trainer", status
    assert f"cannot fetch kohya sd-scripts commit {wrong} from {repo.as_uri()}" in status["reason"], status["reason"]
    assert "not our ref" in status["reason"]
    assert _phases(store, "r-bad")["trainer"]["result"] == "failed"
    assert not store.list("cache/trainers/")


def test_diffusers_examples_come_from_the_tag_of_the_installed_diffusers_with_their_own_venv(tmp_path, seaweed, s3_env):
    tag = "v" + importlib.metadata.version("diffusers")
    repo = tmp_path / "diffusers"
    sha = _diffusers_repo(repo, tag)
    store_cfg = _store_cfg(seaweed, "trainer-sources-diffusers")
    store = open_store(store_cfg)
    store.ensure_bucket()
    (tmp_path / "model").mkdir()
    args = {"instance_prompt": "a photo of sks dog", "instance_data_dir": str(_images(tmp_path / "dog", 1))}
    # The examples' lock, overridden: one local wheel (the real one needs the network).
    lock = tmp_path / "examples-lock.txt"
    lock.write_text(f"# the test's examples lock\nsdcloud-examples-probe @ {_probe_wheel(tmp_path / 'wheels').as_uri()}\n")
    digest = hashlib.sha256(lock.read_text().encode()).hexdigest()[:12]
    sources = {"diffusers_url": repo.as_uri(), "diffusers_examples_lock": str(lock)}  # tag: v<installed diffusers>

    rc, log, work = _agent(tmp_path, "cold", store_cfg, "diffusers", args, sources)
    assert rc == 0, log[-4000:]
    assert _phases(store, "r-cold")["trainer"]["result"] == "fetched"
    assert store.head(f"cache/trainers/diffusers-examples-{tag}.tar") is not None
    keys = [o.key for o in store.list("cache/trainers/")]
    # Keyed by the examples lock and the environment's own key (main lock, torch build, python).
    venv_key = f"cache/trainers/diffusers-examples-venv-{digest}-{scripts.env_tag()}"
    assert [k for k in keys if k.startswith(venv_key + ".tar.")], keys
    assert not [k for k in keys if k.endswith(".part")]
    tree = work / "trainers" / f"diffusers-examples-{tag}"
    venv = work / "trainers" / f"diffusers-examples-venv-{digest}-{scripts.env_tag()}"
    cmd = _trainer_command(log)
    assert cmd[:4] == [str(venv / "bin" / "python"), "-m", "accelerate.commands.launch",
                       str(tree / "examples" / "dreambooth" / "train_dreambooth_lora_sdxl.py")], cmd
    # The real pip installed the lock into the venv, with our lock as constraints.
    assert "pip install -r examples-lock.txt" in log and "pip: Successfully installed sdcloud-examples-probe-0.0.1" in log, log
    # Layered: the script runs in the venv, its lock's package from the venv, diffusers from our environment.
    purelib = sysconfig.get_paths()["purelib"]
    assert f"DIFFUSERS_PREFIX {venv}" in log, log[-3000:]
    assert f"DIFFUSERS_LAYERS {purelib}/diffusers/__init__.py {venv}/lib/" in log, log[-3000:]
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("sdcloud-examples-probe")  # the training environment is untouched
    assert (tree / ".sdcloud-source").read_text().split()[-1] == sha
    assert store.head("runs/r-cold/artifacts/final_weights.safetensors") is not None

    # The next host: no repository, no wheel; both come from the bucket, pip does not run.
    shutil.rmtree(repo)
    shutil.rmtree(tmp_path / "wheels")
    rc, log, work2 = _agent(tmp_path, "warm", store_cfg, "diffusers", args, sources)
    assert rc == 0, log[-4000:]
    assert _phases(store, "r-warm")["trainer"]["result"] == "restored"
    venv2 = work2 / "trainers" / venv.name
    assert _trainer_command(log)[0] == str(venv2 / "bin" / "python")
    assert "pip install" not in log and f"DIFFUSERS_LAYERS {purelib}/diffusers/__init__.py {venv2}/lib/" in log, log[-3000:]

    # A tag that is not in the repository (a diffusers without a matching release) fails the phase.
    rc, _, _ = _agent(tmp_path, "notag", store_cfg, "diffusers", args,
                        {"diffusers_url": (tmp_path / "gone").as_uri(), "diffusers_tag": "v0.0.0"})
    status = json.loads(store.get("runs/r-notag/status.json"))
    assert rc == 1 and status["boot_phase"] == "trainer" and "diffusers examples tag v0.0.0" in status["reason"], status


def test_the_examples_lock_pins_the_torchvision_paired_with_our_torch():
    pins = scripts.lock_pins(scripts.examples_lock())
    torch = boot.TORCH_PIN.split("==")[1]
    # PyTorch releases torchvision 0.(N+15) with torch 2.N (2.13.0 <-> 0.28.0): a torch bump needs a torchvision one.
    major, minor = (int(x) for x in torch.split(".")[:2])
    assert major == 2 and pins["torchvision"].split(".")[:2] == ["0", str(minor + 15)], (torch, pins["torchvision"])
    assert {"torchvision", "datasets", "ftfy", "tensorboard"} <= set(pins)
    # Exact pins only, none of them in (or clashing with) the main lock or torch.
    text = scripts.examples_lock()
    lines = [ln.split("#", 1)[0].strip() for ln in text.splitlines()]
    assert all("==" in ln for ln in lines if ln), lines
    main = scripts.lock_pins(boot.lock_text("cu128"))
    assert not set(pins) & (set(main) | {"torch"}), set(pins) & set(main)
    assert "torchvision" not in main  # never in the main lock: its PyPI build breaks diffusers beside the CPU torch
    # torchvision comes from the torch build's index on CUDA, from the package index on CPU; the rest from the index.
    paired, rest = scripts.examples_plan(text, "cu128")
    assert paired == [f"torchvision=={pins['torchvision']}", "--index-url", gpu.TORCH_INDEX + "cu128"]
    assert scripts.examples_plan(text, "cpu")[0] == [f"torchvision=={pins['torchvision']}"]
    assert scripts.examples_plan(text, "cu130", "2.13.0+cu130")[0][-1] == gpu.TORCH_INDEX + "cu130"
    # A +cpu torch (CI's wheel on disk) takes its pair from the CPU index: the package index's is built for CUDA.
    assert scripts.examples_plan(text, "cpu", "2.13.0+cpu")[0][1:] == ["--index-url", gpu.TORCH_INDEX + "cpu"]
    assert "torchvision" not in scripts.lock_pins(rest) and f"datasets=={pins['datasets']}" in rest
    assert scripts.examples_plan("ftfy==1\n", "cu128") == (None, "ftfy==1\n")


def test_commands_use_absolute_paths_and_keep_what_the_user_gave(tmp_path):
    root = tmp_path / "tree"
    (root / "examples" / "text_to_image").mkdir(parents=True)
    (root / "examples" / "text_to_image" / "train_text_to_image_sdxl.py").write_text("")
    (root / "sdxl_train.py").write_text("")
    base = {"steps": 10, "checkpoint_every": 5, "model": "m", "workdir": tmp_path, "checkpoint_dir": tmp_path / "ck",
            "output_dir": tmp_path / "out"}

    def cmd(trainer, args, **kw):
        return trainer.command(Context(**base, trainer_args=args, **kw))

    k = cmd(KohyaTrainer(), {"script": "sdxl_train.py", "resolution": "1024"}, trainer_root=root, trainer_python="/v/bin/python")
    assert k[:4] == ["/v/bin/python", "-m", "accelerate.commands.launch", str(root / "sdxl_train.py")]
    # `accelerate launch <options>` keeps its options on the absolute launcher.
    d = cmd(DiffusersTrainer(), {"script": "train_text_to_image_sdxl.py", "launcher": "accelerate launch --num_processes 2"},
            trainer_root=root)
    assert d[:6] == [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2",
                     str(root / "examples" / "text_to_image" / "train_text_to_image_sdxl.py")]
    # A launcher of the user's own and an absolute script are kept as given; nothing to fetch then.
    assert cmd(KohyaTrainer(), {"launcher": ["/x/run"], "script": "t.py"})[:2] == ["/x/run", "t.py"]
    assert not scripts.needed("kohya", {"launcher": ["/x/run"]}) and not scripts.needed("diffusers", {"script": "/s.py"})
    assert scripts.needed("kohya", {}) and scripts.needed("diffusers", {"launcher": "accelerate launch --multi_gpu"})
    assert not scripts.needed("builtin", {}) and not scripts.needed("command", ["x"])
    with pytest.raises(FileNotFoundError, match="no example script 'train_nothing.py'"):
        cmd(DiffusersTrainer(), {"script": "train_nothing.py"}, trainer_root=root)
    assert "-e ." not in scripts.requirements(_write(tmp_path / "r", "a==1\n-e .\n  -e . # ours\nb\n"))


def _write(folder: Path, requirements: str) -> Path:
    folder.mkdir()
    (folder / "requirements.txt").write_text(requirements)
    return folder


def test_the_pinned_kohya_commit_is_a_full_sha():
    url, ref = scripts.pins()["kohya"]
    assert url == "https://github.com/kohya-ss/sd-scripts" and len(ref) == 40 and int(ref, 16)
    assert scripts.pins()["diffusers"] == ("https://github.com/huggingface/diffusers", "v{version}")
