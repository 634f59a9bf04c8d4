"""A user's run handed over to the cloud driver and finished by it, on moto and on the Tencent fake,
with the handler run under each function's own Python from the built package.

The run is what a user makes: a dataset folder (images + captions), a local .safetensors model and
a config.toml whose [network] mirror must reach every host. The laptop hands it over (a) with what
`up --unattended` does, or (b) its controller, a process of its own, launches the first host, sees it
train, and is SIGKILLed (no release: its lease, made short in that process, lapses; the host is
then reclaimed while nobody drives). The laptop's paths
are then deleted. The handler (Lambda's python3.13, SCF's Python 3.10: tests/support/harness_interpreters.py), each
invocation in an empty home that knows nothing but the bucket, takes the run, launches; the host is
reclaimed (moto: the instance terminated; the fake: a spot reclaim); the handler relaunches; the
host reports success; the handler ends the run and its host.

The host side is a lightweight stand-in (say so: no agent runs on moto's or the fake's instances):
it writes the run's status.json in the bucket as the agent does, training for the first attempt it
sees, then succeeded. Authorization: on moto every AWS call the handler makes is recorded inside
its process (tests/support/authz/authz_record.py) and judged against the function role's policy the AWS stack
builds (tests/support/authz/authz_aws.py, with the stack's launch template: CreateTags on every type it tags; the run's
store there is the stack's bucket on moto's S3, so the journal and lease calls are judged too);
on the Tencent fake the handler signs with keys holding only the SCF role's CAM policy, which the
fake enforces on every CVM call (add_user_keys).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import SUPPORT

pytest.importorskip("pulumi")
pytest.importorskip("pulumi_aws")
pytest.importorskip("tencentcloud_iac_pulumi")

from tests.support import fake_tencent_api
from tests.support.harness_interpreters import python_for
from tests.support.server_seaweed import wait_until
from tests.stacks.test_authz_aws import _env, stack  # noqa: F401  (stack: a fixture)
from tests.stacks.test_authz_tencent import INFRA as TC_INFRA, TEMPLATE as TC_TEMPLATE, scf_policy  # noqa: F401
from tests.stacks.test_stacks_driver import BUCKET, PREFIX
from tests.infra.test_function_package import package  # noqa: F401  (package: the built function, per module)
from tests.runs.drivers.test_handover_inputs import MIRROR, _agent, _user_inputs


STEPS = 20

# One invocation as the platform makes it, on a clock whose waits pass at once (a poll's sleep moves
# the function's monotonic time, so an invocation takes the few rounds SDCLOUD_DRIVER_SECONDS allows);
# on Lambda every API call the process makes is recorded.
INVOKE = r"""
import json, sys, time
_real, _waited = time.monotonic, [0.0]
time.sleep = lambda s: _waited.__setitem__(0, _waited[0] + s)  # a poll's wait passes at once
time.monotonic = lambda: _real() + _waited[0]
cloud, log = sys.argv[1], sys.argv[2]
if cloud == "aws":
    # The recorder by its file alone: the checkout is not on this path, so a module the package lacks still fails.
    import importlib.util
    spec = importlib.util.spec_from_file_location("authz_record", sys.argv[3])
    authz_record = importlib.util.module_from_spec(spec)
    sys.modules["authz_record"] = authz_record
    spec.loader.exec_module(authz_record)
    authz_log, install = authz_record.authz_log, authz_record.install
    install(authz_log(log, "driver"), lambda o, n, v: setattr(o, n, v), principal="driver")
    from sdcloud.driver import unattended

    class Context:
        aws_request_id = None
        deadline = time.monotonic() + 120

        def get_remaining_time_in_millis(self):
            return int((self.deadline - time.monotonic()) * 1000)

    report = unattended.handler({"sdcloud": "drive"}, Context())
else:
    import sdcloud_driver
    report = sdcloud_driver.main_handler({"Type": "Timer", "TriggerName": "sdcloud-driver", "Time": "", "Message": ""},
                                         {"time_limit_in_ms": 120000})
print(json.dumps({"python": list(sys.version_info[:2]), "report": report}))
"""


# The laptop's controller (what `up` leaves running), stepping its run until it is killed.
LAPTOP = r"""
import sys, time
from sdcloud.runs.records import lease as driver
driver.MIN_LEASE_SECONDS, driver.LEASE_POLLS = 0.5, 0
from sdcloud.runs.driving.controller import Controller
from sdcloud.runs.records.state import StateStore
ctl = Controller(StateStore(sys.argv[1]), sys.argv[2], driver="laptop")
ctl.lease.acquire_or_refuse()
ctl.reconcile()
for _ in range(3000):
    if ctl.step():
        break
    time.sleep(0.1)
"""


class Moto:
    """moto's EC2 over HTTP, with the AWS stack's launch template, host profile and group in it."""

    name, region, function = "aws", "us-east-1", "aws-lambda"

    def __init__(self, url: str, built: dict, monkeypatch, tmp_path: Path):
        import boto3

        keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": self.region}
        for k, v in {**keys, "AWS_ENDPOINT_URL": url}.items():
            monkeypatch.setenv(k, v)
        self.ec2 = boto3.client("ec2", region_name=self.region)
        vpc = self.ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
        subnets = self.ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]
        sg = self.ec2.create_security_group(GroupName=f"sdcloud-host-{tmp_path.name}", Description="hosts",
                                            VpcId=vpc)["GroupId"]
        iam = boto3.client("iam", region_name=self.region)
        role = built["host_role"].rsplit("/", 1)[-1]  # the stack's own host role, passed to each host
        try:
            iam.create_role(RoleName=role, AssumeRolePolicyDocument="{}")
            iam.create_instance_profile(InstanceProfileName=role)
            iam.add_role_to_instance_profile(InstanceProfileName=role, RoleName=role)
        except iam.exceptions.EntityAlreadyExistsException:  # an earlier case of this module made it
            pass
        profile = iam.get_instance_profile(InstanceProfileName=role)["InstanceProfile"]["Arn"]
        self.stack = built
        image = self.ec2.describe_images()["Images"][0]["ImageId"]
        template = self.ec2.create_launch_template(LaunchTemplateName=f"sdcloud-host-{tmp_path.name}", LaunchTemplateData={
            "ImageId": image, "IamInstanceProfile": {"Arn": profile}, "SecurityGroupIds": [sg],
            "TagSpecifications": [{"ResourceType": s["resourceType"],
                                   "Tags": [{"Key": k, "Value": v} for k, v in s["tags"].items()]}
                                  for s in built["template"]["tagSpecifications"]]})["LaunchTemplate"]["LaunchTemplateId"]
        self.infra = {"launch_template_id": template, "security_group_id": sg, "instance_profile_arn": profile,
                      "subnet_ids": {s["AvailabilityZone"]: s["SubnetId"] for s in subnets}, "image_id": image,
                      "region": self.region}
        self.profile = profile
        # The run's store is the stack's bucket and prefix, on moto's S3: the function reaches it
        # through the API only, and its calls there are judged with the rest.
        s3 = boto3.client("s3", region_name=self.region)
        if BUCKET not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
            s3.create_bucket(Bucket=BUCKET)
        self.store_url = f"s3://{BUCKET}/{PREFIX}"
        self.env = {**keys, "AWS_ENDPOINT_URL": url}
        self.python = python_for((3, 13), "Lambda runs python3.13")
        self.log = tmp_path / "authz"
        # A step looks for the run's instances in every catalog region; moto builds each region's EC2 on
        # its first call (seconds each), which it does here, not inside the function's time.
        from concurrent.futures import ThreadPoolExecutor

        from sdcloud.providers import get_provider

        def warm(region: str) -> None:
            boto3.client("ec2", region_name=region).describe_instances()

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(warm, get_provider("aws", region=self.region).catalog_regions()))

    def instances(self, rid: str) -> list[dict]:
        return [i for r in self.ec2.describe_instances(Filters=[{"Name": "tag:sdcloud:run", "Values": [rid]}])[
            "Reservations"] for i in r["Instances"]]

    def live(self, rid: str) -> list[str]:
        return [i["InstanceId"] for i in self.instances(rid) if i["State"]["Name"] in ("pending", "running")]

    def user_data(self, iid: str) -> str:
        value = self.ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"]["Value"]
        return base64.b64decode(value).decode()

    def reclaim(self, iid: str) -> None:
        self.ec2.terminate_instances(InstanceIds=[iid])

    def judge(self) -> list:
        from tests.support.authz.authz_record import read_log

        from tests.support.authz.authz_aws import refused
        from tests.support.authz.authz_expand import expand_aws

        calls = [c for c in read_log(self.log) if c.ok]
        assert {("s3", "PutObject"), ("s3", "GetObject"), ("ec2", "RunInstances")} <= {
            (c.service, c.operation) for c in calls}, "the journal, the lease and the launches are all judged"
        env = _env(self.stack, self.profile)
        # An instance the laptop launched carries its tags when the function ends it (EC2 reads them).
        env.instance_tags.update({i["InstanceId"]: {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                                  for i in self.all_instances()})
        policy = self.stack["policies"]["driver-access"]
        return calls, [f"{c.service}:{c.operation} needs {req} — source: {req.source}" for c in calls
                       for req in refused(policy, expand_aws(c.service, c.operation, c.params, env, c.result))]

    def all_instances(self) -> list[dict]:
        return [i for r in self.ec2.describe_instances()["Reservations"] for i in r["Instances"]]


class Tencent:
    """The Tencent fake's CVM API over HTTP, with the stack's launch template; the function's keys hold
    only the SCF role's CAM policy."""

    name, region, function = "tencent", "ap-guangzhou", "tencent-scf"

    def __init__(self, srv, policy: dict, monkeypatch, tmp_path: Path):
        self.srv = srv
        monkeypatch.setenv("SDCLOUD_TENCENT_ENDPOINT", srv.endpoint)
        monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", fake_tencent_api.SECRET_ID)  # the laptop: the account's keys
        monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", fake_tencent_api.SECRET_KEY)
        monkeypatch.setattr("sdcloud.providers.tencent.session.METADATA_URL", "http://127.0.0.1:9/")
        srv.cvm.add_launch_template(TC_INFRA["launch_template_id"], TC_TEMPLATE)
        self.infra = {**TC_INFRA, "region": self.region}
        sid, skey = srv.cvm.add_user_keys("sdcloud-driver-role", [json.dumps(policy)])
        self.refused: list[str] = []
        authorize = srv.cvm.authorize

        def judged(secret_id, token, action, region, params):  # the fake refuses as CAM does; kept here too
            try:
                return authorize(secret_id, token, action, region, params)
            except fake_tencent_api.ApiError as exc:
                self.refused.append(f"{action}: {exc}")
                raise
        monkeypatch.setattr(srv.cvm, "authorize", judged)
        self.env = {"SDCLOUD_TENCENT_ENDPOINT": srv.endpoint, "SDCLOUD_TENCENT_IMAGE_ID": TC_INFRA["image_id"],
                    "TENCENTCLOUD_SECRETID": sid, "TENCENTCLOUD_SECRETKEY": skey}
        self.python = python_for((3, 10), "SCF runs Python3.10")
        self.store_url = None  # a folder: the fake has no COS

    def _mine(self, rid: str) -> list:
        return [i for i in self.srv.cvm.instances.values() if i.tags.get("sdcloud:run") == rid]

    def instances(self, rid: str) -> list:
        return self._mine(rid)

    def live(self, rid: str) -> list[str]:
        ids = {i.id for i in self.srv.cvm.live()}
        return [i.id for i in self._mine(rid) if i.id in ids]

    def user_data(self, iid: str) -> str:
        raw = self.srv.cvm.instances[iid].user_data
        return raw if "SDCLOUD_CONFIG" in raw else base64.b64decode(raw).decode()

    def reclaim(self, iid: str) -> None:
        self.srv.cvm.reclaim(iid)

    def judge(self) -> tuple[list, list]:
        calls = [c for c in self.srv.cvm.calls if c.get("caller") != "account"]
        assert {c["caller"] for c in calls} == {"role:sdcloud-driver-role"}
        return calls, self.refused


class Spec:
    """What the user-data of a launch says (the agent's config)."""

    def __init__(self, text: str):
        self.user_data = text


def _attempts(store, rid: str, strict: bool = True) -> list:
    """The run's attempts as its journal in the bucket tells them (a third machine's view)."""
    from sdcloud.runs.records.journal import restore
    from sdcloud.runs.records.state import StateStore

    seen = StateStore()
    if restore(seen, store, rid) is None:
        assert not strict, "the run is not in the bucket's journal"
        return []
    return seen.attempts(rid)


def _host_reports(store, rid: str, phase: str, step: int) -> int:
    """The stand-in host: status.json for the run's current attempt, written where the agent writes
    it, in the agent's shape. Returns the attempt."""
    n = _attempts(store, rid)[-1].n
    doc = {"run": rid, "attempt": n, "phase": phase, "step": step, "total_steps": STEPS, "it_per_s": 2.0,
           "loss": 0.1, "gpu_util": None, "disk_free_gb": None, "time": time.time(), "reason": ""}
    store.put(f"runs/{rid}/status.json", json.dumps(doc).encode())
    return n


@pytest.fixture
def cloud(request, tmp_path, monkeypatch):
    if request.param == "aws":
        url = request.getfixturevalue("moto_server")
        yield Moto(url, request.getfixturevalue("stack"), monkeypatch, tmp_path)
        return
    monkeypatch.setattr(fake_tencent_api, "PENDING_S", 0.05)
    monkeypatch.setattr(fake_tencent_api, "TERMINATING_S", 0.1)
    with fake_tencent_api.FakeServer() as srv:
        yield Tencent(srv, request.getfixturevalue("scf_policy"), monkeypatch, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["up-unattended", "controller-killed"])
@pytest.mark.parametrize("cloud", ["aws", "tencent"], indirect=True)
def test_a_users_run_is_relaunched_and_finished_by_the_handler_alone(package, cloud, how, tmp_path,  # noqa: F811
                                                                    monkeypatch, sdcloud_home):
    from sdcloud.providers.traits import traits
    from sdcloud.runs.driving.controller import Controller, new_run_id
    from sdcloud.runs.records.journal import restore
    from sdcloud.runs.records.state import StateStore
    from sdcloud.runs.records.store import open_run_store

    _, task = package
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text(f'[network]\npip_index_url = "{MIRROR}"\n')
    ds, model = _user_inputs(tmp_path / "laptop")
    url = cloud.store_url or (tmp_path / "bucket").as_uri()
    store = open_run_store({"url": url, "region": cloud.region})
    laptop = StateStore(sdcloud_home / "state.db")
    laptop.save_infra(cloud.name, cloud.region, cloud.infra)
    rid = new_run_id()
    laptop.create_run(rid, "sd15-lora", {"tier": "sd15-lora", "provider": cloud.name, "region": cloud.region,
                                         "model": str(model), "dataset": str(ds), "steps": STEPS, "market": "spot",
                                         "store": url}, STEPS)
    if how == "up-unattended":
        Controller(laptop, rid).hand_over()
        assert not cloud.instances(rid)
    else:
        # The laptop's controller as its own process, stepping until it is SIGKILLed (its lease term
        # made short there, so that it lapses at once here).
        laptop.close()
        proc = subprocess.Popen([sys.executable, "-c", LAPTOP, str(sdcloud_home / "state.db"), rid],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # The first host is live and the journal in the bucket says so (the laptop flushes after its launch).
            wait_until(lambda: cloud.live(rid) and [a.instance_id for a in _attempts(store, rid, strict=False)]
                       == cloud.live(rid) or proc.poll() is not None, timeout=120, every=0.2)
            [first] = cloud.live(rid)
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            _host_reports(store, rid, "training", 5)
            wait_until(lambda: StateStore(sdcloud_home / "state.db").get_run(rid)["step"] == 5 or proc.poll() is not None,
                       timeout=60, every=0.2)
            assert proc.poll() is None, proc.communicate()[1][-3000:]
        finally:
            proc.kill()  # SIGKILL: no more steps, no release, no goodbye
            proc.communicate(timeout=30)
        laptop = StateStore(sdcloud_home / "state.db")
        # The controller is dead. Its host is reclaimed while nobody drives.
        cloud.reclaim(first)
        time.sleep(0.6)
    laptop_launches = 1 if how == "controller-killed" else 0
    # The laptop's paths are gone, its home too: only the bucket carries the run.
    shutil.rmtree(tmp_path / "laptop")
    laptop.close()
    shutil.rmtree(sdcloud_home)

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(task), "HOME": str(tmp_path),
           "SDCLOUD_STORE": url, "SDCLOUD_STORE_REGION": cloud.region,
           "SDCLOUD_DRIVER_SECONDS": str(4 * traits(cloud.name).timing.poll_seconds), "PYTHONDONTWRITEBYTECODE": "1",
           **cloud.env}
    reports = []

    def invoke() -> dict:
        home = tmp_path / f"function-{len(reports)}"
        recorder = str(SUPPORT / "authz" / "authz_record.py")
        run = subprocess.run([cloud.python, "-S", "-c", INVOKE, cloud.name, str(tmp_path / "authz"), recorder],
                             env={**env, "SDCLOUD_HOME": str(home)}, cwd=tmp_path, capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
        out = json.loads(run.stdout.strip().splitlines()[-1])
        assert tuple(out["python"]) == {"aws": (3, 13), "tencent": (3, 10)}[cloud.name]
        reports.append(out["report"])
        assert "error" not in out["report"]["runs"].get(rid, {}), out["report"]
        assert len(cloud.live(rid)) <= 1, f"two hosts live: {cloud.live(rid)}"
        return out["report"]

    def until(cond, what: str, tries: int = 3) -> None:
        for _ in range(tries):
            if cond():
                return
            invoke()
        if not cond():
            from sdcloud.runs.records.journal import restore
            from sdcloud.runs.records.state import StateStore

            seen = StateStore()
            restore(seen, store, rid)
            events = [(e["kind"], e["data"]) for e in seen.events(rid)][-12:]
            pytest.fail(f"{what} after {len(reports)} invocations: {reports}; the run's last events: {events}")

    until(lambda: len(cloud.live(rid)) == 1, "no launch from the handler")
    [second] = cloud.live(rid)
    assert [a.instance_id for a in _attempts(store, rid)][laptop_launches:] == [second]
    user_data = {second: cloud.user_data(second)}
    _host_reports(store, rid, "training", 8)
    invoke()
    cloud.reclaim(second)  # a reclaim while the function drives
    until(lambda: len(_attempts(store, rid)) == laptop_launches + 2 and len(cloud.live(rid)) == 1,
          "no relaunch after the reclaim")
    [third] = cloud.live(rid)
    assert _attempts(store, rid)[-1].instance_id == third
    user_data[third] = cloud.user_data(third)
    attempt = _host_reports(store, rid, "succeeded", STEPS)
    until(lambda: store.head(f"drivers/active/{rid}") is None, "the run is still live")
    assert not cloud.live(rid), "the handler left an instance"

    # Every launch the handler made carries the bucket's references and config.toml's mirror.
    for text in user_data.values():
        agent = _agent(Spec(text))
        assert agent["dataset"] == url + f"/runs/{rid}/dataset"
        assert agent["model"].startswith("cache:cache/models/local-") and agent["model"].endswith(
            "#base-v1.safetensors")
        assert agent["network"]["pip_index_url"] == MIRROR, "config.toml's [network] reached the host"
    # What the bucket says, read by a machine that never saw the run.
    seen = StateStore()
    assert restore(seen, store, rid) is not None
    run = seen.get_run(rid)
    assert run["state"] == "succeeded" and run["step"] == STEPS
    attempts = seen.attempts(rid)
    assert attempts[-1].n == attempt and attempts[-1].end_reason == "succeeded"
    assert all(a.end_reason != "succeeded" for a in attempts[:-1]) and len(attempts) == laptop_launches + 2
    kinds = [e["kind"] for e in seen.events(rid)]
    # One record per event, however many empty homes rebuilt the run: a take-over per invocation that
    # took the run, a reclaim per host taken back.
    took = [r for r in reports if "steps" in r["runs"].get(rid, {})]
    assert kinds.count("driver-took-over") == len(took), (kinds, reports)
    assert kinds.count("reclaimed") == laptop_launches + 1, kinds
    # The handler's calls, judged as the cloud judges them.
    calls, refusals = cloud.judge()
    ops = [(c.operation, c.params) if hasattr(c, "operation") else (c["action"], c["params"]) for c in calls]
    assert {"RunInstances", "TerminateInstances"} <= {op for op, _ in ops}, ops
    launches = [params for op, params in ops if op == "RunInstances"]
    assert len(launches) >= 2 and all("LaunchTemplate" in p for p in launches), "from the stack's template"
    assert not refusals, "\n".join(refusals)
