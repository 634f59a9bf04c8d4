"""The cloud driver's function package (sdcloud/infra/function_package.py) builds from the project,
loads its handler with nothing but what it carries under each cloud function's own Python, and
fits every function's limits.

The package is unzipped into an empty folder and the handler imported by `python -S` with
PYTHONPATH set to that folder alone: no site-packages, so a dependency the zip lacks fails the
import here as it would on Lambda or SCF. The interpreter is the runtime's version (Lambda's
python3.13, SCF's Python3.10: the traits), found by tests/support/harness_interpreters.py. Every module the run
loads must come from the folder or that interpreter's standard library. No network: the
distributions are copied from this venv, as a Lambda zip is.
"""

from __future__ import annotations

import ast
import datetime
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sdcloud.providers.tencent import function as function_entry
from sdcloud.infra import function_package as fp

from tests.support.harness_interpreters import python_for
from tests.support import ROOT

FUNCTIONS = fp.runtimes()

# Run inside the unzipped package: the SCF entry first (it gives 3.10 the names of 3.11 the control
# plane uses), the handler on an empty bucket (both platforms' event shapes), then the modules a
# step reaches on each cloud, with the clients it makes (no call is sent).
PROBE = r"""
import json, os, sys, sysconfig
import sdcloud_driver
from sdcloud.driver import unattended
out = {"python": list(sys.version_info[:2]),
       "lambda": unattended.handler({"sdcloud": "drive"}, None),
       "scf": sdcloud_driver.main_handler({"Type": "Timer", "TriggerName": "t", "Time": "", "Message": ""},
                                          {"time_limit_in_ms": 60000})}
# A Lambda configured before the driver moved calls its handler by the old name (providers/aws/function.py LEGACY_HANDLER).
from sdcloud.runs import unattended as legacy
out["legacy"] = legacy.handler is unattended.handler and legacy.main_handler is unattended.main_handler
import sdcloud.runs.driving.controller, sdcloud.runs.records.journal, sdcloud.runs.records.lease, sdcloud.runs.driving.hostboot
import sdcloud.providers.aws.compute as aws_compute, sdcloud.providers.tencent.compute as tc_compute
import sdcloud.providers.tencent.storage, sdcloud.costs.ledger, sdcloud.spot.policy, sdcloud.offers.tiers
import boto3
boto3.session.Session(region_name="us-east-1").client("ec2")
from tencentcloud.common import credential
from tencentcloud.cvm.v20170312 import cvm_client
cvm_client.CvmClient(credential.Credential("id", "key"), "ap-guangzhou")
from sdcloud_agent import wheel
out["agent_wheel"] = wheel.current().filename
from sdcloud.events import Kind
import tomllib
kind = next(iter(Kind))
out["kind"] = [str(kind), "%s" % kind, format(kind), json.dumps(kind), Kind(kind.value) is kind]
out["toml"] = tomllib.loads('a = {b = [1, "x"]}')
out["tiers"] = sorted(sdcloud.offers.tiers.all_tiers())  # the bundled tiers.toml, parsed by tomllib
stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
here = os.path.realpath(sys.argv[1])
out["outside"] = sorted({m.__name__.split(".")[0] for m in list(sys.modules.values())
                         if getattr(m, "__file__", None)
                         and not os.path.realpath(m.__file__).startswith((stdlib, here))})
out["site"] = [p for p in sys.path if "site-packages" in p]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> tuple[fp.FunctionPackage, Path]:
    pkg = fp.current()  # built once per process: `infra up` and every test here use the same bytes
    where = tmp_path_factory.mktemp("fn")
    path = pkg.write(where / "zip")
    with zipfile.ZipFile(path) as zf:
        zf.extractall(where / "task")
    return pkg, where / "task"


@pytest.mark.slow
def test_the_package_fits_every_function_s_limits(package):
    pkg, task = package
    assert pkg.over_limits() == []
    for fn in FUNCTIONS:
        limits = fn.code_limits
        assert limits is not None, fn.name
        assert pkg.unzipped_bytes < limits.unzipped_bytes
        # A zip in the request must fit the request; SCF's would not (API 3.0 POSTs stop at 10 MB).
        assert fn.code_from_bucket or (pkg.zipped_bytes < limits.inline_zip_bytes
                                       and pkg.inline_request_bytes < limits.request_bytes), fn.name
        assert fn.code_from_bucket == (pkg.inline_request_bytes > limits.request_bytes), fn.name
    on_disk = sum(p.stat().st_size for p in task.rglob("*") if p.is_file())
    assert on_disk == pkg.unzipped_bytes
    # Only what the handler needs: no trainer, report or SSH libraries.
    names = {p.name.lower() for p in task.iterdir()}
    for heavy in ("torch", "diffusers", "numpy", "matplotlib", "paramiko", "rich", "click", "awscrt", "pulumi"):
        assert heavy not in names, heavy
    assert {"sdcloud", "sdcloud_agent", "boto3", "botocore", "tencentcloud", "yaml", "tenacity", "tomli",
            function_entry.ENTRY, function_entry.COMPAT} <= names
    assert not (task / "sdcloud" / "infra" / "stacks").exists()
    # The control plane's wheel metadata declares exactly the package's dependencies.
    [meta] = list(task.glob("sdcloud-*.dist-info/METADATA"))
    declared = [ln.split(": ", 1)[1] for ln in meta.read_text().splitlines() if ln.startswith("Requires-Dist: ")]
    assert declared == list(fp.DEPENDENCIES)


def test_each_function_names_a_python_its_cloud_offers():
    from sdcloud.providers.aws import limits as aws_limits
    from sdcloud.providers.tencent import limits as tencent_limits
    from sdcloud.providers.traits import traits

    lam, scf = traits("aws").function, traits("tencent").function
    # A new function can be created with it for at least another year (Lambda's "Block function create").
    block = datetime.date.fromisoformat(aws_limits.FUNCTION_PYTHON_BLOCK_CREATE[lam.runtime])
    assert block > datetime.date.today() + datetime.timedelta(days=365)
    assert scf.runtime in tencent_limits.FUNCTION_PYTHON_RUNTIMES
    # The newest Python SCF offers (the control plane's 3.11 is not among them).
    assert scf.python == max(tuple(int(x) for x in r.removeprefix("Python").split("."))
                             for r in tencent_limits.FUNCTION_PYTHON_RUNTIMES)


@pytest.mark.slow
def test_the_package_is_pure_python_and_each_compiled_module_left_out_has_its_fallback(package):
    pkg, task = package
    with zipfile.ZipFile(io.BytesIO(pkg.data)) as zf:
        names = zf.namelist()
    assert not [n for n in names if fp._BINARY.search(n)]
    # This venv's PyYAML and charset-normalizer are compiled: they were left out, with their fallbacks.
    assert pkg.left_out, "no compiled file was met: the test no longer shows the rule"
    for rel, fallback in pkg.left_out.items():
        if fallback.endswith(".py"):
            assert fallback in names, rel
        else:
            assert fallback, rel


def test_a_compiled_module_without_a_pure_python_fallback_is_refused():
    files = {"fast/__init__.py": b"from .core import go\n", "fast/core.cpython-311-x86_64-linux-gnu.so": b"\x7fELF"}
    with pytest.raises(fp.PackageError, match="fast/core has no pure-Python fallback"):
        fp._leave_out_binaries(dict(files))
    files["fast/core.py"] = b"def go():\n    pass\n"
    kept = dict(files)
    assert fp._leave_out_binaries(kept) == {"fast/core.cpython-311-x86_64-linux-gnu.so": "fast/core.py"}
    assert sorted(kept) == ["fast/__init__.py", "fast/core.py"]


def test_a_construct_newer_than_the_oldest_runtime_is_refused():
    newer = b"try:\n    pass\nexcept* ValueError:\n    pass\n"  # exception groups: 3.11
    with pytest.raises(fp.PackageError, match="sdcloud/runs/x.py"):
        fp._check_versions({"sdcloud/runs/x.py": newer}, [], [(3, 10), (3, 13)])
    fp._check_versions({"sdcloud/runs/x.py": newer}, [], [(3, 13)])
    # A distribution whose Requires-Python leaves a runtime out is refused too (boto3 needs >= 3.9).
    with pytest.raises(fp.PackageError, match="boto3 requires Python"):
        fp._check_versions({}, ["boto3"], [(3, 8)])


@pytest.mark.slow
@pytest.mark.parametrize("fn", FUNCTIONS, ids=[f.name for f in FUNCTIONS])
def test_the_handler_runs_under_the_function_s_own_python(package, tmp_path, fn):
    """Under the runtime's own interpreter (not this one), with nothing but the package."""
    _, task = package
    python = python_for(fn.python, f"{fn.name} runs {fn.runtime}")
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(task), "HOME": str(tmp_path),
           "SDCLOUD_STORE": bucket.as_uri(), "SDCLOUD_HOME": str(tmp_path / "fn-tmp"),
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run([python, "-S", "-c", PROBE, str(task)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert tuple(out["python"]) == fn.python
    # Nothing live: nothing driven (the report's other keys, such as the invocation's identity, aside).
    assert (out["lambda"]["driver"], out["lambda"]["runs"]) == ("aws-lambda", {})
    assert (out["scf"]["driver"], out["scf"]["runs"]) == ("tencent-scf", {})
    assert out["legacy"] is True
    assert out["site"] == [] and out["outside"] == []
    assert out["agent_wheel"].startswith("sdcloud_agent-")
    # Events and TOML read as under 3.11 (where 3.10 needs sdcloud_py310's StrEnum and tomllib).
    from sdcloud.events import Kind
    from sdcloud.offers.tiers import all_tiers

    kind = next(iter(Kind))
    assert out["kind"] == [str(kind), "%s" % kind, format(kind), json.dumps(kind), True] == [kind.value] * 3 + [
        json.dumps(kind.value), True]
    assert out["toml"] == {"a": {"b": [1, "x"]}}
    assert out["tiers"] == sorted(all_tiers())


@pytest.mark.slow
def test_the_package_s_own_code_needs_nothing_of_a_newer_python_but_what_the_shim_gives(package):
    """vermin over all of sdcloud and sdcloud_agent in the package (not only what the probe imports)
    at the oldest runtime's version: each name it needs from a newer Python is one sdcloud_py310 gives."""
    import re
    import shutil

    _, task = package
    oldest = min(fn.python for fn in FUNCTIONS)
    exe = shutil.which("vermin", path=str(Path(sys.executable).parent)) or shutil.which("vermin")
    assert exe, "vermin is in the dev extra (pyproject.toml)"
    run = subprocess.run([exe, "-q", "--no-tips", "--violations", "--eval-annotations", "-t=%d.%d-" % oldest,
                          "sdcloud", "sdcloud_agent", function_entry.ENTRY], cwd=task, capture_output=True,
                         text=True, timeout=300)
    needs = set(re.findall(r"^\s+'([\w.]+)' (?:module|member|function|class)", run.stdout, re.M))
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("  ")]
    assert len(lines) == len(re.findall(r"^\s+'[\w.]+' (?:module|member|function|class)", run.stdout, re.M)), run.stdout
    if oldest < (3, 11):
        assert needs == set(function_entry.COMPAT_NAMES), run.stdout
    else:
        assert run.returncode == 0 and not needs, run.stdout


# SCF's entry as SCF calls it, once: a timer event and a dict context. The live-run tests below let
# the function drive for 40 s (SDCLOUD_DRIVER_SECONDS): room for the takeover and a step on a busy
# two-core machine running the suite (15 s was too short there); its steps are a poll (5 s) apart,
# so a run is launched on the first.
SCF_STEP = r"""
import json, sys
import sdcloud_driver
report = sdcloud_driver.main_handler({"Type": "Timer", "TriggerName": "sdcloud-driver", "Time": "", "Message": ""},
                                     {"time_limit_in_ms": 120000})
print(json.dumps({"python": list(sys.version_info[:2]), "report": report}))
"""


@pytest.mark.slow
def test_scf_s_entry_drives_a_live_run_under_scf_s_python(package, tmp_path, monkeypatch):
    """Not only the imports: SCF's entry, called as SCF calls it (a timer event, the role's keys in
    SCF's own variable names), under SCF's Python with the package alone, takes over a run that no
    laptop drives and launches its host through the CVM API (the Tencent fake, over HTTP)."""
    from tests.support import fake_tencent_api
    from tests.support.fake_tencent_api import SECRET_ID, SECRET_KEY, FakeServer

    from sdcloud.providers.traits import traits
    from sdcloud.runs.driving.controller import new_run_id
    from sdcloud.runs.records.journal import Journal, restore
    from sdcloud.runs.records.state import StateStore
    from sdcloud_agent.store import LocalStore

    _, task = package
    fn = traits("tencent").function
    python = python_for(fn.python, f"{fn.name} runs {fn.runtime}")
    monkeypatch.setattr(fake_tencent_api, "PENDING_S", 0.2)
    bucket = tmp_path / "bucket"
    laptop = StateStore(tmp_path / "laptop.db")
    rid = new_run_id()
    laptop.create_run(rid, "sd15-lora", {"tier": "sd15-lora", "provider": "tencent", "region": "ap-guangzhou",
                                         "model": "tiny", "steps": 20, "market": "spot", "store": bucket.as_uri()}, 20)
    Journal(laptop, LocalStore(bucket), rid).flush()
    with FakeServer() as srv:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(task), "HOME": str(tmp_path),
               "SDCLOUD_STORE": bucket.as_uri(), "SDCLOUD_HOME": str(tmp_path / "fn-tmp"),
               "SDCLOUD_DRIVER_SECONDS": "40", "SDCLOUD_TENCENT_ENDPOINT": srv.endpoint,
               "SDCLOUD_TENCENT_IMAGE_ID": "img-scf", "PYTHONDONTWRITEBYTECODE": "1",
               # What SCF sets for a function with a role (the entry maps them for the SDK and the store).
               "TENCENTCLOUD_SECRETID": SECRET_ID, "TENCENTCLOUD_SECRETKEY": SECRET_KEY,
               "TENCENTCLOUD_SESSIONTOKEN": "scf-session"}
        run = subprocess.run([python, "-S", "-c", SCF_STEP], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=300)
        launched = [(i.id, i.tags) for i in srv.cvm.instances.values()]
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert tuple(out["python"]) == fn.python
    assert out["report"]["driver"] == "tencent-scf" and rid in out["report"]["runs"], out
    assert len(launched) == 1, (launched, out, run.stderr[-2000:])
    # The journal the function wrote back tells any machine what it did.
    seen = StateStore(tmp_path / "seen.db")
    assert restore(seen, LocalStore(bucket), rid) is not None
    [attempt] = seen.attempts(rid)
    assert attempt.instance_id == launched[0][0]
    assert "driver-took-over" in [e["kind"] for e in seen.events(rid)]


# Lambda's handler as EventBridge Scheduler invokes it, once, with a context as Lambda passes one.
LAMBDA_STEP = r"""
import json, sys, time
from sdcloud.driver import unattended


class Context:
    deadline = time.monotonic() + 120

    def get_remaining_time_in_millis(self):
        return int((self.deadline - time.monotonic()) * 1000)


report = unattended.handler({"sdcloud": "drive"}, Context())
print(json.dumps({"python": list(sys.version_info[:2]), "report": report}))
"""


@pytest.mark.slow
def test_lambda_s_handler_drives_a_live_run_under_lambda_s_python(package, tmp_path, moto_server, aws_env):
    """Lambda's handler under python3.13's version with the package alone takes over a run that no
    laptop drives and launches its host through EC2 (moto's server, over HTTP), from the stack's
    outputs the journal carries (an image moto has)."""
    import boto3

    from sdcloud.providers.traits import traits
    from sdcloud.runs.driving.controller import new_run_id
    from sdcloud.runs.records.journal import Journal, restore
    from sdcloud.runs.records.state import StateStore
    from sdcloud_agent.store import LocalStore

    _, task = package
    fn = traits("aws").function
    python = python_for(fn.python, f"{fn.name} runs {fn.runtime}")
    bucket = tmp_path / "bucket"
    laptop = StateStore(tmp_path / "laptop.db")
    laptop.save_infra("aws", "us-east-1", {"image_id": "ami-12c6146b", "region": "us-east-1"})
    rid = new_run_id()
    laptop.create_run(rid, "sd15-lora", {"tier": "sd15-lora", "provider": "aws", "region": "us-east-1",
                                         "model": "tiny", "steps": 20, "market": "spot", "store": bucket.as_uri()}, 20)
    Journal(laptop, LocalStore(bucket), rid).flush()
    keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    # A step looks for the run's instances in every region of the catalog; moto builds a region's EC2
    # on its first call there (seconds each), which here, not inside the function's time, it does now.
    from concurrent.futures import ThreadPoolExecutor

    from sdcloud.providers import get_provider

    def warm(region: str) -> None:
        boto3.client("ec2", endpoint_url=moto_server, region_name=region, aws_access_key_id="testing",
                     aws_secret_access_key="testing").describe_instances()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(warm, get_provider("aws", region="us-east-1").catalog_regions()))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(task), "HOME": str(tmp_path),
           "SDCLOUD_STORE": bucket.as_uri(), "SDCLOUD_HOME": str(tmp_path / "fn-tmp"), "SDCLOUD_DRIVER_SECONDS": "40",
           "AWS_ENDPOINT_URL": moto_server, "PYTHONDONTWRITEBYTECODE": "1", **keys}
    run = subprocess.run([python, "-S", "-c", LAMBDA_STEP], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert tuple(out["python"]) == fn.python
    assert out["report"]["driver"] == "aws-lambda" and rid in out["report"]["runs"], out
    ec2 = boto3.client("ec2", endpoint_url=moto_server, region_name="us-east-1", aws_access_key_id="testing",
                       aws_secret_access_key="testing")
    launched = [i["InstanceId"] for r in ec2.describe_instances(
        Filters=[{"Name": "tag:sdcloud:run", "Values": [rid]}])["Reservations"] for i in r["Instances"]]
    assert len(launched) == 1, (launched, out, run.stderr[-2000:])
    seen = StateStore(tmp_path / "seen.db")
    assert restore(seen, LocalStore(bucket), rid) is not None
    [attempt] = seen.attempts(rid)
    assert attempt.instance_id == launched[0]
    ec2.terminate_instances(InstanceIds=launched)


def test_the_build_is_deterministic_and_follows_the_content():
    a_name, a_version, a_bytes, _ = fp.control_plane_wheel()
    b_name, b_version, b_bytes, _ = fp.control_plane_wheel()
    assert (a_name, a_version, a_bytes) == (b_name, b_version, b_bytes)
    assert a_name == f"sdcloud-{a_version}-py3-none-any.whl"


def _third_party_imports(paths: list[Path]) -> set[str]:
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
    return {n for n in found if n not in sys.stdlib_module_names and n not in ("sdcloud", "sdcloud_agent")}


def test_the_modules_a_step_runs_import_nothing_undeclared_at_module_level():
    """The step's own modules' top-level imports are all in the package (lazy ones are checked by running it)."""
    step_modules = ["sdcloud/driver/unattended.py", "sdcloud/runs/driving/controller.py", "sdcloud/runs/records/journal.py",
                    "sdcloud/runs/records/lease.py", "sdcloud/runs/records/store.py", "sdcloud/providers/aws/compute.py",
                    "sdcloud/providers/tencent/compute.py"]
    step_modules += [f"bootstrap/sdcloud_agent/store/{m}.py" for m in ("__init__", "base", "faults", "local", "s3")]
    imported = _third_party_imports([ROOT / m for m in step_modules])
    provided = {"boto3", "botocore", "tenacity", "tencentcloud", "yaml", "urllib3", "s3transfer"}
    assert imported <= provided, imported - provided


@pytest.mark.slow
def test_infra_up_writes_the_package_once_per_version(sdcloud_home):
    from sdcloud.infra import automation

    first = automation.driver_package()
    assert first.parent == sdcloud_home / "driver" and first.name == fp.current().filename
    stamp = first.stat().st_mtime_ns
    assert automation.driver_package() == first and first.stat().st_mtime_ns == stamp
    assert "aws" in automation.DRIVER_PROVIDERS


def test_scf_role_keys_reach_the_sdk_and_the_store(tmp_path, monkeypatch):
    (tmp_path / function_entry.ENTRY).write_text(function_entry.ENTRY_TEXT)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sdcloud_driver", raising=False)
    import sdcloud_driver

    env = {"TENCENTCLOUD_SECRETID": "AKIDtemp", "TENCENTCLOUD_SECRETKEY": "k", "TENCENTCLOUD_SESSIONTOKEN": "t"}
    sdcloud_driver.role_credentials(env)
    assert env["TENCENTCLOUD_SECRET_ID"] == env["AWS_ACCESS_KEY_ID"] == "AKIDtemp"
    assert env["TENCENTCLOUD_SECRET_KEY"] == env["AWS_SECRET_ACCESS_KEY"] == "k"
    assert env["TENCENTCLOUD_SESSION_TOKEN"] == env["AWS_SESSION_TOKEN"] == "t"
    untouched: dict = {}
    sdcloud_driver.role_credentials(untouched)
    assert untouched == {}
    monkeypatch.delitem(sys.modules, "sdcloud_driver")
