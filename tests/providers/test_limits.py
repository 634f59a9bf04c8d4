"""Every payload sdcloud builds for a cloud, at the largest size a real run produces, against the limits
that cloud documents (sdcloud/providers/<name>/limits.py, each figure cited there).

Largest means: every training tier with every trainer (the kohya and diffusers trainers carry the
longest argument sets), the longest region of the provider's catalog or network profiles (Tencent's
mainland ones bring the mirror settings), a bucket name as long as the cloud allows, a budget, a
deadline, a local model (a cache reference) and a local dataset (a bucket URL), and a
config.toml that points pip at the VPC-internal mirror (a longer URL than the profile's). The
user-data is built by the controller's own launch code (runs/driving/launching.py) and rendered by the
agent's renderer, as a launch does."""

from __future__ import annotations

import base64
import csv
import importlib
import json
import re
from pathlib import Path
from types import ModuleType

import pytest
from PIL import Image

from sdcloud.offers.tiers import all_tiers
from sdcloud.providers.base import LaunchSpec
from sdcloud.providers.traits import is_cloud, names, traits
from sdcloud.runs.driving.controller import new_run_id
from sdcloud.runs.driving.launching import LaunchInputs
from sdcloud.runs.driving.owner import Memo
from sdcloud.runs.driving.run_row import RunRow
from sdcloud.runs.inputs.spec import build_spec
from sdcloud.runs.records.state import StateStore
from sdcloud.runs.records.store import store_config
from sdcloud_agent.store import LocalStore

from tests.support import ROOT
from tests.support.harness_stacks import stack_module

CLOUDS = names(where=is_cloud)
TRAINER_ARGS = {  # what each external trainer needs at least (runs/inputs/training.py refuses a run without them)
    "builtin": {},
    "kohya": {"dataset_config": "/var/lib/sdcloud/work/dataset/sdcloud-kohya-dataset.toml"},
    "diffusers": {"instance_prompt": "a photo of sks person, studio light, 85 mm, sharp focus",
                  "instance_data_dir": "/var/lib/sdcloud/work/dataset"},
}


def limits(provider: str) -> ModuleType:
    return importlib.import_module(f"sdcloud.providers.{provider}.limits")


def longest_region(provider: str) -> str:
    """The longest region name a run of this provider may use: its catalog's, its network profiles'."""
    t = traits(provider)
    regions = {t.default_region} | {r for net in t.network_profiles for r in net.regions}
    catalog = ROOT / "sdcloud" / "data" / "catalog" / f"{provider}.csv"
    if catalog.exists():
        with catalog.open() as f:
            regions |= {row["region"] for row in csv.DictReader(f) if row.get("region")}
    return max(sorted(regions), key=len)


def longest_bucket(provider: str, region: str) -> str:
    """A bucket name as long as the cloud's naming rules allow."""
    lim = limits(provider)
    if lim.BUCKET_DOMAIN_CHARS is not None:  # COS: <name>-<APPID>, the whole domain within the limit
        tail = f"-1250000000.cos.{region}.myqcloud.com"
        name = "b" * (lim.BUCKET_DOMAIN_CHARS - len(tail)) + "-1250000000"
    else:
        name = "b" * lim.BUCKET_NAME_CHARS[1]
    assert re.fullmatch(lim.BUCKET_NAME_PATTERN, name), name
    return name


def user_data_problems(provider: str, text: str) -> list[str]:
    lim, raw = limits(provider), text.encode()
    out = []
    if lim.USER_DATA_RAW_BYTES is not None and len(raw) > lim.USER_DATA_RAW_BYTES:
        out.append(f"{provider}: user-data is {len(raw)} bytes, over {lim.USER_DATA_RAW_BYTES} before base64")
    encoded = len(base64.b64encode(raw))
    if lim.USER_DATA_BASE64_BYTES is not None and encoded > lim.USER_DATA_BASE64_BYTES:
        out.append(f"{provider}: user-data is {encoded} bytes in base64, over {lim.USER_DATA_BASE64_BYTES}")
    return out


def tag_problems(provider: str, tags: dict[str, str], what: str) -> list[str]:
    lim = limits(provider)
    out = []
    if len(tags) > lim.TAGS_PER_RESOURCE:
        out.append(f"{provider} {what}: {len(tags)} tags, over {lim.TAGS_PER_RESOURCE}")
    for k, v in tags.items():
        if not 1 <= len(k) <= lim.TAG_KEY_CHARS or k.lower().startswith(lim.TAG_RESERVED_PREFIXES):
            out.append(f"{provider} {what}: tag key {k!r} ({len(k)} chars; at most {lim.TAG_KEY_CHARS}, "
                       f"none of {lim.TAG_RESERVED_PREFIXES})")
        if len(v) > lim.TAG_VALUE_CHARS:
            out.append(f"{provider} {what}: tag {k!r} has a {len(v)}-char value, over {lim.TAG_VALUE_CHARS}")
    return out


def key_problems(provider: str, key: str) -> list[str]:
    lim = limits(provider)
    size = len(key.encode())
    out = [f"{provider}: key {key[:60]!r}... is {size} bytes, over {lim.OBJECT_KEY_BYTES}"] if size > lim.OBJECT_KEY_BYTES else []
    if lim.OBJECT_KEY_NO_LEADING and key.startswith(lim.OBJECT_KEY_NO_LEADING):
        out.append(f"{provider}: key {key!r} starts with one of {lim.OBJECT_KEY_NO_LEADING}")
    return out


class _Run:
    """What the controller's launch side reads of the controller (LaunchOwner), with a run of its
    own, and nothing else of the controller."""

    def __init__(self, plan, run_id, store, store_conf, infra, state):
        self.plan, self.spec, self.run_id, self.store, self.store_conf, self.infra, self.state = (
            plan, plan.spec, run_id, store, store_conf, infra, state)
        self.total_steps, self.memo, self.events, self._inputs = 100_000, Memo(), [], None
        self.timing = traits(plan.spec.provider).timing
        self.row = RunRow(state, run_id)

    def event(self, kind, data=None):
        self.events.append((kind, data))

    def ensure_inputs(self) -> dict:
        """The run's inputs staged in its bucket as the controller stages them (runs/inputs/staging.py)."""
        from sdcloud.runs.inputs import staging as inputs

        if self._inputs is None:
            self._inputs = inputs.stage(self)
        return self._inputs

    def cost_so_far(self) -> float:
        return 123.4567

    def expected_job_hours(self) -> float:
        return 9999.999


def _launch(*args) -> LaunchInputs:
    return LaunchInputs(_Run(*args))


FAMILY_KEYS = {"sd15": "cond_stage_model.transformer.x.weight", "sdxl": "conditioner.embedders.1.x.weight",
               "sd3": "model.diffusion_model.joint_blocks.0.x.weight"}


def _user_folders(tmp_path: Path, family: str) -> tuple[Path, Path]:
    """What a user has: a dataset folder of images with captions, a local model file of the tier's family."""
    import numpy as np
    from safetensors.numpy import save_file

    ds = tmp_path / "my dataset"
    ds.mkdir()
    for n in range(3):
        Image.new("RGB", (64, 64), (n * 40, 90, 200)).save(ds / f"img-{n}.png")
        (ds / f"img-{n}.txt").write_text(f"a photo of sks person, number {n}\n")
    model = tmp_path / "my-finetuned-model-v2-with-a-long-descriptive-name-for-the-file.safetensors"
    save_file({FAMILY_KEYS[family]: np.zeros(4, np.float32),
               "model.diffusion_model.input_blocks.0.0.weight": np.zeros(4, np.float32)}, str(model))
    return ds, model


def largest_launch(provider: str, tier: str, trainer: str, tmp_path: Path, home: Path) -> LaunchSpec:
    """The LaunchSpec of attempt 999 of the largest run of `tier` on `provider`."""
    region = longest_region(provider)
    bucket = longest_bucket(provider, region)
    ds, model = _user_folders(tmp_path, all_tiers()[tier].family)
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(  # the VPC-internal mirror: longer than the profile's public one
        '[network]\npip_index_url = "http://mirrors.tencentyun.com/pypi/simple"\n')
    run = tmp_path / "run.yaml"
    args = "".join(f"  {k}: {json.dumps(v)}\n" for k, v in TRAINER_ARGS[trainer].items())
    run.write_text(f"tier: {tier}\nprovider: {provider}\nregion: {region}\ntrainer: {trainer}\n"
                   f"dataset: {ds}\nmodel: {model}\nbudget: 99999.99\ndeadline: 999\n"
                   + (f"trainer-args:\n{args}" if args else ""))
    plan = build_spec(str(run), {})
    infra = {"bucket": bucket, "prefix": "sdcloud", "region": region}
    store_conf = store_config(provider, None, region, infra)
    state = StateStore(home / "state.db")
    run_id = new_run_id()
    state.create_run(run_id, tier, {}, 100_000)
    launch = _launch(plan, run_id, LocalStore(tmp_path / "bucket"), store_conf, infra, state)
    return launch.launch_spec(999)


TRAINING_TIERS = sorted(n for n, t in all_tiers().items() if not n.startswith("batch-"))


@pytest.mark.parametrize("provider", CLOUDS)
def test_the_user_data_of_the_largest_run_fits_the_cloud(provider, tmp_path, sdcloud_home, monkeypatch):
    from sdcloud.runs.inputs import carry

    # The mainland profile carries kohya's sources into the bucket: that upload is not what is measured.
    monkeypatch.setattr(carry, "carry_trainer_sources", lambda store, agent: "present")
    sizes = {}
    for tier in TRAINING_TIERS:
        for trainer in TRAINER_ARGS:
            case = tmp_path / f"{tier}-{trainer}"
            case.mkdir()
            spec = largest_launch(provider, tier, trainer, case, sdcloud_home)
            text = spec.user_data
            assert text.startswith("#!/bin/bash") and "@@" not in text, text[:200]
            assert user_data_problems(provider, text) == []
            sizes[(tier, trainer)] = room(provider, text)
    least = min(sizes.values())
    # A user's own trainer arguments and longer mirror URLs go on top of these: at least 1 KiB of room.
    # (Before the renderer dropped the template's comment lines, Tencent's sdxl-lora with kohya had 128 bytes.)
    assert least >= 1024, f"{provider}: {min(sizes, key=sizes.get)} leaves {least} bytes under the user-data limit"
    print(f"\n{provider}: {least} bytes of room under the user-data limit ({min(sizes, key=sizes.get)})")


def room(provider: str, text: str) -> int:
    """Bytes left under the cloud's user-data limit, counted as the cloud counts them."""
    lim, raw = limits(provider), text.encode()
    left = []
    if lim.USER_DATA_RAW_BYTES is not None:
        left.append(lim.USER_DATA_RAW_BYTES - len(raw))
    if lim.USER_DATA_BASE64_BYTES is not None:
        left.append(lim.USER_DATA_BASE64_BYTES - len(base64.b64encode(raw)))
    return min(left)


def test_the_agents_renderer_holds_the_strictest_clouds_user_data_limit():
    """The agent cannot import the control plane's limits: its renderer's own figure must be the
    strictest cloud's (base64), and it is no looser than any cloud's count before base64."""
    from sdcloud_agent.userdata import MAX_USER_DATA

    after = [limits(p).USER_DATA_BASE64_BYTES for p in CLOUDS if limits(p).USER_DATA_BASE64_BYTES is not None]
    before = [limits(p).USER_DATA_RAW_BYTES for p in CLOUDS if limits(p).USER_DATA_RAW_BYTES is not None]
    assert after and MAX_USER_DATA == min(after)
    assert all(MAX_USER_DATA // 4 * 3 <= b for b in before)


def test_the_user_data_check_fails_a_script_over_each_clouds_limit():
    """The checks above can fail: a script one byte over each cloud's limit is named."""
    for provider in CLOUDS:
        lim = limits(provider)
        if lim.USER_DATA_RAW_BYTES is not None:
            assert user_data_problems(provider, "x" * (lim.USER_DATA_RAW_BYTES + 1))
            assert not user_data_problems(provider, "x" * lim.USER_DATA_RAW_BYTES)
        if lim.USER_DATA_BASE64_BYTES is not None:
            n = lim.USER_DATA_BASE64_BYTES // 4 * 3
            assert not user_data_problems(provider, "x" * n) and user_data_problems(provider, "x" * (n + 1))


# -- tags and the launch request ------------------------------------------------------------------



def template_tags(provider: str, region: str) -> dict[str, str]:
    """The tags the stack's host template puts on a host: its stack is named after the region
    (sdcloud/infra/automation.py) and its owner tag is the login name (32 characters at most on Linux)."""
    stack = stack_module(provider)
    return stack.tags_for(stack.StackConfig(stack=region, region=region, owner_tag="o" * 32), "host")


def _aws_request(spec: LaunchSpec, region: str) -> tuple[dict, dict[str, dict[str, str]]]:
    import boto3

    from sdcloud.providers.aws.compute import AwsProvider

    session = boto3.session.Session(region_name=region, aws_access_key_id="x", aws_secret_access_key="x")
    infra = {"launch_template_id": "lt-0123456789abcdef0", "security_group_id": "sg-0123456789abcdef0",
             "instance_profile_arn": "arn:aws:iam::123456789012:instance-profile/sdcloud-" + region + "-host"}
    params = AwsProvider(region=region, session=session)._run_params(
        spec, "p5.48xlarge", region + "a", "spot", 98.7654, "ami-0123456789abcdef0", "/dev/sda1", infra,
        "subnet-0123456789abcdef0")
    # The launch template tags these resource types too (stacks/aws: driver_policy.LAUNCH_TAGGED); a
    # resource carries the template's tags and the request's.
    stack_module("aws")
    LAUNCH_TAGGED = stack_module("aws", "driver_policy").LAUNCH_TAGGED

    tags = {kind: dict(template_tags("aws", region)) for kind in LAUNCH_TAGGED}
    for ts in params["TagSpecifications"]:
        tags.setdefault(ts["ResourceType"], {}).update({t["Key"]: t["Value"] for t in ts["Tags"]})
    return params, tags


def _tencent_request(spec: LaunchSpec, region: str) -> tuple[dict, dict[str, dict[str, str]]]:
    from sdcloud.offers.catalog import CatalogRow
    from sdcloud.offers.optimizer import Offer
    from sdcloud.providers.tencent.compute import TencentProvider

    zone = region + "-8"
    spec.infra = {"launch_template_ids": {zone: "lt-0123abcd"}, "host_tags": template_tags("tencent", region),
                  "subnet_ids": {zone: "subnet-0123abcd"}, "cam_role_name": "sdcloud-" + region + "-host"}
    row = CatalogRow("tencent", region, zone, "GN10Xp.20XLARGE320", "V100", 8, 32, 80, 320, 0, 99.99, 29.99, "CNY",
                     None, "2026-01-01", False, False, "test")
    params = TencentProvider()._run_params(Offer(row, "spot"), spec, "spot", zone, "99.99")
    tags = {ts["ResourceType"]: {t["Key"]: t["Value"] for t in ts["Tags"]} for ts in params["TagSpecification"]}
    return params, tags


def _vast_request(spec: LaunchSpec, region: str) -> tuple[dict, dict[str, dict[str, str]]]:
    from sdcloud.providers.vast.compute import VastProvider, tags_of

    # The store's session keys as STS gives them (a session token runs to about 1-2 KB): the largest env.
    keys = {"AWS_ACCESS_KEY_ID": "A" * 20, "AWS_SECRET_ACCESS_KEY": "s" * 40, "AWS_SESSION_TOKEN": "t" * 2048,
            "SDCLOUD_STORE_KEYS_EXPIRE": "2026-12-31T23:59:59+00:00"}
    body = VastProvider()._create_body(spec, keys)
    assert len(body["label"]) <= limits("vast").LABEL_CHARS
    return {**body, "UserData": body["onstart"]}, {"instance": tags_of(body["label"])}


REQUESTS = {"aws": _aws_request, "tencent": _tencent_request, "vast": _vast_request}


@pytest.mark.parametrize("provider", CLOUDS)
def test_the_largest_launch_request_and_its_tags_fit_the_cloud(provider, tmp_path, sdcloud_home, monkeypatch):
    """The request of the largest run's 999th attempt: every resource it tags within the tag limits,
    the request body (its user-data base64-encoded, as sent) within the API's."""
    from sdcloud.runs.inputs import carry

    monkeypatch.setattr(carry, "carry_trainer_sources", lambda store, agent: "present")
    spec = largest_launch(provider, "sdxl-lora", "kohya", tmp_path, sdcloud_home)
    params, tags = REQUESTS[provider](spec, longest_region(provider))
    assert "sdcloud:run" in tags["instance"] and "sdcloud:token" in tags["instance"]
    problems = [p for kind, t in tags.items() for p in tag_problems(provider, t, kind)]
    assert problems == []
    lim = limits(provider)
    body = json.dumps({**params, "UserData": params.get("UserData", "")}).encode()
    if lim.API_POST_BYTES is not None:
        assert len(body) <= lim.API_POST_BYTES, f"{provider}: the launch request is {len(body)} bytes"
    assert user_data_problems(provider, spec.user_data) == []


def test_the_tag_check_fails_what_each_cloud_refuses():
    for provider in CLOUDS:
        lim = limits(provider)
        assert tag_problems(provider, {"k" * (lim.TAG_KEY_CHARS + 1): "v"}, "x")
        assert tag_problems(provider, {"k": "v" * (lim.TAG_VALUE_CHARS + 1)}, "x")
        assert tag_problems(provider, {f"k{n}": "v" for n in range(lim.TAGS_PER_RESOURCE + 1)}, "x")
        assert tag_problems(provider, {lim.TAG_RESERVED_PREFIXES[0] + "x": "v"}, "x")
        assert not tag_problems(provider, {"k" * lim.TAG_KEY_CHARS: "v" * lim.TAG_VALUE_CHARS}, "x")


# -- bucket keys ----------------------------------------------------------------------------------

def key_heads(tmp_path: Path) -> dict[str, str]:
    """The keys sdcloud's own layout makes for the longest ids (a run's 999th attempt, step
    999 999 999, a scheduled batch job), from the modules that make them; what a trainer or a user
    names (a checkpoint's files, a dataset's paths) goes after the heads that end in '/'."""
    from sdcloud_agent import boot, manifest
    from sdcloud_agent import wheel as agent_wheel

    from sdcloud.batch.submit import job_prefix
    from sdcloud.runs.driving import host_status
    from sdcloud.runs.records import journal

    run = new_run_id()
    run_prefix = f"runs/{run}"
    return {
        "checkpoint": manifest.checkpoint_prefix(run_prefix, 999_999_999) + "/",
        "status": host_status.status_key(run),
        "journal": journal.prefix(run) + "/",
        "boot report": f"{run_prefix}/boot/attempt-999.json",
        "boot log": f"{run_prefix}/logs/boot-999.log",
        "dataset": f"{run_prefix}/dataset/",
        "environment cache": boot.env_key("cu130", "313")[0],
        "agent wheel": agent_wheel.ensure_uploaded(LocalStore(tmp_path / "b")).key,
        "batch job": job_prefix("b-ffffffff") + "/",
    }


@pytest.mark.parametrize("provider", CLOUDS)
def test_sdcloud_keys_leave_room_for_what_trainers_and_users_name(provider, tmp_path):
    """Under the bucket's prefix (sdcloud infra's `sdcloud`, or a user's own of 64 characters), every
    key sdcloud makes fits the cloud's key limit with at least 512 bytes to spare for the names a
    trainer gives a checkpoint's files or a user gives a dataset's."""
    lim = limits(provider)
    for store_prefix in ("sdcloud", "p" * 64):
        for what, head in key_heads(tmp_path).items():
            key = f"{store_prefix}/{head}"
            assert key_problems(provider, key) == [], what
            assert lim.OBJECT_KEY_BYTES - len(key.encode()) >= 512, (what, key)


def test_the_key_check_fails_what_each_cloud_refuses():
    for provider in CLOUDS:
        lim = limits(provider)
        assert key_problems(provider, "k" * (lim.OBJECT_KEY_BYTES + 1))
        assert not key_problems(provider, "k" * lim.OBJECT_KEY_BYTES)
        assert key_problems(provider, "é" * (lim.OBJECT_KEY_BYTES // 2 + 1))  # bytes, not characters


def test_a_dataset_path_longer_than_the_buckets_keys_is_refused_before_launch(sdcloud_home, tmp_path, capsys):
    """A dataset file's key is `<prefix>/runs/<run>/dataset/<its path>`: one path that COS cannot take
    (850 bytes) but S3 can (1,024) is refused for Tencent with one line, before anything is recorded."""
    from sdcloud.cli import main

    ds = tmp_path / "ds"
    ds.mkdir()
    Image.new("RGB", (64, 64), (10, 20, 30)).save(ds / "a.png")
    head = len("sdcloud/runs/r-00000000/dataset/".encode())
    deep = ds / ("d" * 200) / ("e" * 200) / ("f" * 200) / ("h" * 200)  # each within a file name's 255
    deep.mkdir(parents=True)
    name = "g" * (900 - head - len(deep.relative_to(ds).as_posix()) - 1 - 4) + ".png"  # a 900-byte key
    Image.new("RGB", (64, 64), (40, 50, 60)).save(deep / name)
    limit = {p: limits(p).OBJECT_KEY_BYTES for p in CLOUDS}
    assert limit["tencent"] < 900 <= limit["aws"]
    run = tmp_path / "run.yaml"
    run.write_text(f"tier: sd15-lora\nprovider: tencent\nregion: ap-singapore\ndataset: {ds}\n")
    capsys.readouterr()
    code = main(["up", "-f", str(run)])
    err = capsys.readouterr().err
    assert code == 2 and "900-byte key" in err and "over the 850 bytes" in err and err.count("\n") == 1, err
    assert StateStore().list_runs() == []  # nothing recorded
    # The same dataset fits S3's keys.
    run.write_text(f"tier: sd15-lora\nprovider: aws\nregion: us-east-1\ndataset: {ds}\n")
    assert build_spec(str(run), {}).spec.dataset == str(ds)


@pytest.mark.parametrize("provider", [p for p in CLOUDS if traits(p).function is not None])
def test_the_cloud_drivers_timeout_is_within_the_functions_limit(provider):
    """The stacks create the driver with TRAITS.function's timeout: the cloud refuses one past its
    function limit (Lambda 900 s, SCF 900 s for an event function)."""
    fn = traits(provider).function
    assert 0 < fn.safety_seconds < fn.timeout_seconds <= limits(provider).FUNCTION_TIMEOUT_SECONDS
