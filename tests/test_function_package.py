"""The cloud driver's function package (sdcloud/infra/function_package.py) builds from the project,
loads its handler with nothing but what it carries, and fits Lambda's and SCF's size limits.

The package is unzipped into an empty folder and the handler imported by `python -S` with
PYTHONPATH set to that folder alone: no site-packages, so a dependency the zip lacks fails the
import here as it would on Lambda. Every module the run loads must come from the folder or the
standard library. No network: the distributions are copied from this venv, as a Lambda zip is.
"""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from sdcloud.infra import function_package as fp

ROOT = Path(__file__).resolve().parents[1]

# Run inside the unzipped package: the handler on an empty bucket (both platforms' event shapes),
# then the modules a step reaches on each cloud, with the clients it makes (no call is sent).
PROBE = r"""
import json, os, sys
import sdcloud_driver
from sdcloud.runs import unattended
out = {"lambda": unattended.handler({"sdcloud": "drive"}, None),
       "scf": sdcloud_driver.main_handler({"Type": "Timer", "TriggerName": "t", "Time": "", "Message": ""},
                                          {"time_limit_in_ms": 60000})}
import sdcloud.runs.controller, sdcloud.runs.journal, sdcloud.runs.driver, sdcloud.runs.hostboot
import sdcloud.providers.aws.compute as aws_compute, sdcloud.providers.tencent.compute as tc_compute
import sdcloud.providers.tencent.storage, sdcloud.costs.ledger, sdcloud.spot.policy
import boto3
boto3.session.Session(region_name="us-east-1").client("ec2")
from tencentcloud.common import credential
from tencentcloud.cvm.v20170312 import cvm_client
cvm_client.CvmClient(credential.Credential("id", "key"), "ap-guangzhou")
from sdcloud_agent import wheel
out["agent_wheel"] = wheel.current().filename
stdlib = os.path.realpath(sys.argv[1])
here = os.path.realpath(sys.argv[2])
out["outside"] = sorted({m.__name__.split(".")[0] for m in list(sys.modules.values())
                         if getattr(m, "__file__", None)
                         and not os.path.realpath(m.__file__).startswith((stdlib, here))})
out["site"] = [p for p in sys.path if "site-packages" in p]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> tuple[fp.FunctionPackage, Path]:
    pkg = fp.build()
    where = tmp_path_factory.mktemp("fn")
    path = pkg.write(where / "zip")
    with zipfile.ZipFile(path) as zf:
        zf.extractall(where / "task")
    return pkg, where / "task"


@pytest.mark.slow
def test_the_package_fits_lambda_and_scf(package):
    pkg, task = package
    assert pkg.over_limits() == []
    assert pkg.zipped_bytes < fp.LAMBDA_ZIPPED_MAX and pkg.unzipped_bytes < fp.LAMBDA_UNZIPPED_MAX
    assert pkg.unzipped_bytes < fp.SCF_UNZIPPED_MAX
    on_disk = sum(p.stat().st_size for p in task.rglob("*") if p.is_file())
    assert on_disk == pkg.unzipped_bytes
    # Only what the handler needs: no trainer, report or SSH libraries.
    names = {p.name.lower() for p in task.iterdir()}
    for heavy in ("torch", "diffusers", "numpy", "matplotlib", "paramiko", "rich", "click", "awscrt", "pulumi"):
        assert heavy not in names, heavy
    assert {"sdcloud", "sdcloud_agent", "boto3", "botocore", "tencentcloud", "yaml", "tenacity", fp.SHIM} <= names
    assert not (task / "sdcloud" / "infra" / "stacks").exists()
    # The control plane's wheel metadata declares exactly the package's dependencies.
    [meta] = list(task.glob("sdcloud-*.dist-info/METADATA"))
    declared = [ln.split(": ", 1)[1] for ln in meta.read_text().splitlines() if ln.startswith("Requires-Dist: ")]
    assert declared == list(fp.DEPENDENCIES)


@pytest.mark.slow
def test_the_handler_imports_and_runs_with_only_what_the_package_carries(package, tmp_path):
    _, task = package
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(task), "HOME": str(tmp_path),
           "SDCLOUD_STORE": bucket.as_uri(), "SDCLOUD_HOME": str(tmp_path / "fn-tmp"),
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "PYTHONDONTWRITEBYTECODE": "1"}
    stdlib = sysconfig.get_paths()["stdlib"]
    run = subprocess.run([sys.executable, "-S", "-c", PROBE, stdlib, str(task)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["lambda"] == {"driver": "aws-lambda", "runs": {}}
    assert out["scf"] == {"driver": "tencent-scf", "runs": {}}
    assert out["site"] == [] and out["outside"] == []
    assert out["agent_wheel"].startswith("sdcloud_agent-")


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
    step_modules = ["sdcloud/runs/unattended.py", "sdcloud/runs/controller.py", "sdcloud/runs/journal.py",
                    "sdcloud/runs/driver.py", "sdcloud/runs/store.py", "sdcloud/providers/aws/compute.py",
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


class _RuntimeAPI:
    """SCF's runtime API as the Custom Runtime docs describe it, on loopback: one timer event, then closed."""

    def __init__(self, events: list[dict]):
        import http.server
        import threading

        self.events, self.posts = list(events), []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                if self.path != "/runtime/invocation/next" or not api.events:
                    self.send_response(410)
                    self.end_headers()
                    return
                body = json.dumps(api.events.pop(0)).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                api.posts.append((self.path, self.rfile.read(length)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()


@pytest.mark.slow
def test_scf_custom_runtime_bootstrap_answers_a_timer_event(package, tmp_path):
    pkg, task = package
    with zipfile.ZipFile(io.BytesIO(pkg.data)) as zf:
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in zf.infolist()}
    assert all(modes[name] == 0o755 for name in fp.SCF_BOOTSTRAPS)
    for name in fp.SCF_BOOTSTRAPS:  # zipfile does not restore modes; SCF's unpacking does
        (task / name).chmod(0o755)
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    api = _RuntimeAPI([{"Type": "Timer", "TriggerName": "sdcloud-driver", "Time": "2026-12-02T01:30:00Z",
                        "Message": ""}])
    try:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SDCLOUD_PYTHON": sys.executable,
               "SCF_RUNTIME_API": "127.0.0.1", "SCF_RUNTIME_API_PORT": str(api.port),
               "SDCLOUD_STORE": bucket.as_uri(), "SDCLOUD_HOME": str(tmp_path / "fn-tmp"),
               "SDCLOUD_TIME_LIMIT_MS": "60000", "PYTHONDONTWRITEBYTECODE": "1"}
        run = subprocess.run([str(task / "scf_bootstrap")], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=300)
    finally:
        api.stop()
    assert run.returncode == 0, run.stderr[-3000:]
    assert [p for p, _ in api.posts] == ["/runtime/init/ready", "/runtime/invocation/response"]
    assert json.loads(api.posts[1][1]) == {"driver": "tencent-scf", "runs": {}}


def test_scf_role_keys_reach_the_sdk_and_the_store(tmp_path):
    import importlib.util

    path = tmp_path / fp.SCF_RUNTIME_LOOP
    path.write_text(fp._SCF_RUNTIME_TEXT)
    spec = importlib.util.spec_from_file_location("scf_loop", path)
    loop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loop)
    env = {"TENCENTCLOUD_SECRETID": "AKIDtemp", "TENCENTCLOUD_SECRETKEY": "k", "TENCENTCLOUD_SESSIONTOKEN": "t"}
    loop.role_credentials(env)
    assert env["TENCENTCLOUD_SECRET_ID"] == env["AWS_ACCESS_KEY_ID"] == "AKIDtemp"
    assert env["TENCENTCLOUD_SECRET_KEY"] == env["AWS_SECRET_ACCESS_KEY"] == "k"
    assert env["TENCENTCLOUD_SESSION_TOKEN"] == env["AWS_SESSION_TOKEN"] == "t"
    untouched: dict = {}
    loop.role_credentials(untouched)
    assert untouched == {}
