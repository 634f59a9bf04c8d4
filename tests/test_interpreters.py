"""Each piece of code under the Python it meets, and a syntax-level minimum check of all of it.

- The host agent (bootstrap/, `requires-python` there: 3.10). On a host, the user-data's own steps
  run on the image's python3 before anything is installed: Ubuntu 22.04's (the AWS DLAMI, Tencent's
  public image) is 3.10, and it runs the boot client (s3lite.py) and, when a boot fails before the
  python phase, the agent's self-end from the wheel. The training environment is then built on
  Python 3.11 (the image's, or the distribution's python3.11 that the user-data installs), where the
  agent itself runs: that is the Python of this suite. So the agent is imported and its entry points
  run here under a Python 3.10 (this machine's pyenv; `SDCLOUD_PYTHON310` names another), from the
  wheel the controller uploads, with the agent's pure-Python dependencies only.
- The control plane (pyproject.toml's `requires-python`: 3.11) and the stacks: vermin checks the
  syntax and the standard library names each uses against the declared minimum, the agent's too.

In CI a missing Python 3.10 fails these tests rather than skipping them (docs/testing.md says how
CI has one).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.harness_interpreters import python_for



def declared_minimum(pyproject: Path) -> tuple[int, int]:
    spec = tomllib.loads(pyproject.read_text())["project"]["requires-python"]
    assert spec.startswith(">="), spec
    major, minor = spec[2:].split(".")[:2]
    return int(major), int(minor)


AGENT_MIN = declared_minimum(ROOT / "bootstrap" / "pyproject.toml")
CONTROL_MIN = declared_minimum(ROOT / "pyproject.toml")


@pytest.fixture(scope="module")
def agent_python() -> str:
    return python_for(AGENT_MIN, f"the agent's minimum: set SDCLOUD_PYTHON{AGENT_MIN[0]}{AGENT_MIN[1]} or install one "
                                 "(docs/testing.md)")


def vermin(target: tuple[int, int], *paths: Path) -> subprocess.CompletedProcess:
    """vermin's violations of `target` as the minimum (syntax, standard library modules and names)."""
    exe = shutil.which("vermin", path=str(Path(sys.executable).parent)) or shutil.which("vermin")
    assert exe, "vermin is in the dev extra (pyproject.toml)"
    return subprocess.run([exe, "-q", "--no-tips", "--violations", "--eval-annotations",
                           f"-t={target[0]}.{target[1]}-", *map(str, paths)], capture_output=True, text=True, timeout=300)


def test_all_code_is_within_its_declared_minimum_python():
    agent = vermin(AGENT_MIN, ROOT / "bootstrap" / "sdcloud_agent")
    assert agent.returncode == 0 and not agent.stdout.strip(), f"the agent needs more than {AGENT_MIN}:\n{agent.stdout}"
    control = vermin(CONTROL_MIN, ROOT / "sdcloud", ROOT / "stacks")
    assert control.returncode == 0 and not control.stdout.strip(), \
        f"the control plane needs more than {CONTROL_MIN}:\n{control.stdout}"


def test_the_minimum_check_fails_code_that_needs_a_newer_python(tmp_path):
    (tmp_path / "new.py").write_text("import tomllib\n\nmatch tomllib:\n    case _:\n        pass\n")
    out = vermin((3, 9), tmp_path)
    assert out.returncode != 0 and "tomllib" in out.stdout and "3.10" in out.stdout, out.stdout


# The agent's dependencies (bootstrap/pyproject.toml: boto3) and theirs, all pure Python: a Python 3.10
# imports them from this suite's environment. Compiled packages (numpy, torch, awscrt) are built for
# this suite's Python; the agent imports them lazily, in the training environment.
PURE_DEPENDENCIES = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six.py", "urllib3")

IMPORT_ALL = r"""
import importlib, pkgutil, sys, sdcloud_agent
ok, missing, broken = [], [], []
for m in pkgutil.walk_packages(sdcloud_agent.__path__, "sdcloud_agent."):
    if m.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(m.name)
        ok.append(m.name)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        (broken if top in sys.stdlib_module_names or top == "sdcloud_agent" else missing).append(f"{m.name}: {exc}")
    except Exception as exc:
        broken.append(f"{m.name}: {type(exc).__name__}: {exc}")
print("OK", len(ok)); print("\n".join("MISSING " + x for x in missing)); print("\n".join("BROKEN " + x for x in broken))
"""


@pytest.fixture(scope="module")
def agent_wheel(tmp_path_factory) -> tuple[Path, Path]:
    """The agent wheel the controller uploads, and a folder of its pure-Python dependencies."""
    from sdcloud_agent import wheel

    built = wheel.current()
    folder = tmp_path_factory.mktemp("agent310")
    whl = folder / built.key.rsplit("/", 1)[-1]
    whl.write_bytes(built.data)
    deps = folder / "deps"
    deps.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for name in PURE_DEPENDENCIES:
        assert (site / name).exists(), f"{name} is not in this environment's site-packages"
        (deps / name).symlink_to(site / name)
    return whl, deps


def _run(python: str, args: list[str], pythonpath: list[Path], cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join(map(str, pythonpath)),
           "HOME": str(cwd), "LANG": "C.UTF-8", "PYTHONNOUSERSITE": "1"}
    return subprocess.run([python, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


def test_the_agent_imports_under_its_minimum_python(agent_python, agent_wheel, tmp_path):
    whl, deps = agent_wheel
    p = _run(agent_python, ["-c", IMPORT_ALL], [whl, deps], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    broken = [x for x in lines if x.startswith("BROKEN")]
    assert not broken, "\n".join(broken)
    ok = int(lines[0].split()[1])
    # Only modules that need a compiled package of the training environment may be missing here.
    missing = [x for x in lines if x.startswith("MISSING")]
    allowed = ("torch", "diffusers", "transformers", "numpy", "PIL", "safetensors", "peft", "accelerate", "awscrt",
               "huggingface_hub", "psutil", "yaml")
    assert all(any(f"'{a}" in x for a in allowed) for x in missing), "\n".join(missing)
    assert ok >= 20, p.stdout


def test_the_boots_own_steps_run_under_the_images_python(agent_python, agent_wheel, tmp_path):
    """What the user-data runs on the image's python3 from the wheel before the environment exists:
    the torch build's index tag, the self-end's command line, the boot client's usage."""
    whl, deps = agent_wheel
    cuda = _run(agent_python, ["-m", "sdcloud_agent.boot", "cuda"], [whl], tmp_path)
    assert cuda.returncode == 0 and cuda.stdout.strip() in ("cpu", "cu126", "cu130"), cuda.stderr[-2000:]
    selfend = _run(agent_python, ["-m", "sdcloud_agent.selfend", "--help"], [whl], tmp_path)
    assert selfend.returncode == 0 and "--reason" in selfend.stdout, selfend.stderr[-2000:]
    agent = _run(agent_python, ["-m", "sdcloud_agent", "--help"], [whl, deps], tmp_path)
    assert agent.returncode == 0, agent.stderr[-2000:]
