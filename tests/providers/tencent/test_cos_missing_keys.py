"""A run whose bucket is on COS (`--store cos://...`), on a machine without the Tencent keys: `down`,
`resume`, `logs` and `down --all` say in one line which keys are missing, exit 2, no traceback
(botocore's NoCredentialsError used to surface from the first request); `down --all` goes on to the
other runs, stops them, and names the one it could not stop (issue 46)."""

from __future__ import annotations

import pytest

from sdcloud.cli import main

COS_RUN, LOCAL_RUN = "r-c05c0002", "r-10ca1001"
KEYS = "TENCENTCLOUD_SECRET_ID and TENCENTCLOUD_SECRET_KEY"


@pytest.fixture
def no_keys(monkeypatch, tmp_path):
    """No Tencent keys, and nothing boto3's own chain could find either (no AWS keys, files or metadata)."""
    import os

    for var in [v for v in os.environ if v.startswith(("TENCENTCLOUD_", "AWS_"))]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))


@pytest.fixture
def two_live_runs(sdcloud_home, no_keys):
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    state.create_run(COS_RUN, "sd15-lora", {"tier": "sd15-lora", "provider": "tencent", "region": "ap-guangzhou",
                                            "model": "tiny", "steps": 10, "store": "cos://sd-bucket-1250000000/sd"}, 10)
    state.update_run(COS_RUN, state="running", step=3)
    state.create_run(LOCAL_RUN, "sd15-lora", {"tier": "sd15-lora", "provider": "local", "model": "tiny"}, 10)
    state.update_run(LOCAL_RUN, state="running", step=3)
    return state


@pytest.mark.parametrize("args", [["down", COS_RUN], ["resume", COS_RUN], ["logs", COS_RUN]])
def test_a_command_on_a_cos_run_without_the_keys_is_one_line_exit_2(capsys, two_live_runs, args):
    assert main(args) == 2
    out = capsys.readouterr()
    assert out.err.count("\n") == 1 and "Traceback" not in out.err and "NoCredentialsError" not in out.err, out.err
    assert KEYS in out.err and "cos://sd-bucket-1250000000/sd" in out.err
    assert two_live_runs.get_run(COS_RUN)["state"] == "running"  # nothing was changed


def test_down_all_stops_the_other_runs_and_names_the_one_it_could_not_stop(capsys, two_live_runs):
    assert main(["down", "--all", "--yes"]) == 2
    out = capsys.readouterr()
    assert two_live_runs.get_run(LOCAL_RUN)["state"] == "stopped", out.err
    assert LOCAL_RUN in out.out and "stopped" in out.out
    assert out.err.count("\n") == 1 and "Traceback" not in out.err
    assert f"could not stop 1 run(s): {COS_RUN}" in out.err and KEYS in out.err
    assert two_live_runs.get_run(COS_RUN)["state"] == "running"


def test_only_the_missing_partner_is_named(monkeypatch, no_keys):
    from sdcloud.errors import UserError
    from sdcloud.providers.tencent import storage

    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", "AKIDexample")
    with pytest.raises(UserError, match=r"set TENCENTCLOUD_SECRET_KEY \("):
        storage.open_store("sd-bucket-1250000000", "sd", "ap-guangzhou")


@pytest.fixture
def aws_keys_only(monkeypatch, no_keys):
    """A shell with AWS keys (and an AWS endpoint) but no Tencent keys; every request botocore would
    send, to any endpoint, counted and refused."""
    import botocore.endpoint

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEEXAMPLE00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-key-example-example-example-00")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    sent: list[str] = []

    def refuse(self, request):
        sent.append(f"{request.method} {request.url}")
        raise AssertionError(f"a request was sent: {request.method} {request.url}")

    monkeypatch.setattr(botocore.endpoint.Endpoint, "_send", refuse)
    return sent


@pytest.mark.parametrize("args", [["down", COS_RUN], ["resume", COS_RUN], ["logs", COS_RUN]])
def test_a_cos_run_is_never_opened_with_the_aws_keys_of_the_shell(capsys, two_live_runs, aws_keys_only, args):
    assert main(args) == 2
    out = capsys.readouterr()
    assert out.err.count("\n") == 1 and "Traceback" not in out.err and "StoreError" not in out.err, out.err
    assert KEYS in out.err and "cos://sd-bucket-1250000000/sd" in out.err, out.err
    assert aws_keys_only == [], "no request went anywhere (AWS least of all)"
    assert two_live_runs.get_run(COS_RUN)["state"] == "running"


def test_down_all_with_only_aws_keys_names_the_cos_run_and_sends_nothing(capsys, two_live_runs, aws_keys_only):
    assert main(["down", "--all", "--yes"]) == 2
    out = capsys.readouterr()
    assert f"could not stop 1 run(s): {COS_RUN}" in out.err and KEYS in out.err, out.err
    assert out.err.count("\n") == 1 and aws_keys_only == []
    assert two_live_runs.get_run(LOCAL_RUN)["state"] == "stopped"
