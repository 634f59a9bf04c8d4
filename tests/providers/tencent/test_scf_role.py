"""`sdcloud infra up --provider tencent` on a fresh account (issue 46): SCF reads the cloud driver's code
from COS only through its service role SCF_QcsRole, which an account has only once SCF's service was
authorized. The Tencent fake refuses such a function without the role, as SCF does; `infra up` asks
CAM (GetRole) first and, where the role is missing, says how to create it in one line, exit 2,
before anything is deployed."""

from __future__ import annotations

import pytest
from tests.support import fake_tencent_api as tencent_fake

from sdcloud.cli import main


@pytest.fixture
def account(monkeypatch, sdcloud_home):
    with tencent_fake.ScfServer() as srv:
        monkeypatch.setenv("SDCLOUD_TENCENT_ENDPOINT", srv.endpoint)
        monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", tencent_fake.SECRET_ID)
        monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", tencent_fake.SECRET_KEY)
        deployed: list[str] = []

        def no_pulumi(*args, **kw):  # what comes after the check: the stack; reached is what we record
            deployed.append("stack")
            from sdcloud.errors import UserError

            raise UserError("the deployment was reached")

        monkeypatch.setattr("sdcloud.infra.automation.pulumi_root", lambda: None)
        monkeypatch.setattr("sdcloud.infra.automation._stack", no_pulumi)
        yield srv.scf, deployed


def test_the_fake_refuses_a_function_from_cos_without_the_service_role(account):
    from tencentcloud.common.common_client import CommonClient
    from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException
    from tencentcloud.common.profile.client_profile import ClientProfile
    from tencentcloud.common.profile.http_profile import HttpProfile

    from sdcloud.providers.tencent.service_role import _client
    from sdcloud.providers.tencent.session import credentials, endpoint_override

    scf, _ = account
    proto, host = endpoint_override()
    client = CommonClient("scf", "2018-04-16", credentials(), "ap-guangzhou",
                          ClientProfile(httpProfile=HttpProfile(protocol=proto, endpoint=host)))
    code = {"CosBucketName": "sd-1250000000", "CosObjectName": "/driver/sdcloud-driver.zip"}
    scf.roles.discard("SCF_QcsRole")
    with pytest.raises(TencentCloudSDKException, match="SCF_QcsRole"):
        client.call_json("CreateFunction", {"FunctionName": "sdcloud-driver", "Code": code, "Runtime": "Python3.10"})
    with pytest.raises(TencentCloudSDKException, match="RoleNotExist"):
        _client("ap-guangzhou", None).call_json("GetRole", {"RoleName": "SCF_QcsRole"})
    scf.roles.add("SCF_QcsRole")
    client.call_json("CreateFunction", {"FunctionName": "sdcloud-driver", "Code": code, "Runtime": "Python3.10"})
    assert ("ap-guangzhou", "default", "sdcloud-driver") in scf.functions


def test_infra_up_without_the_role_says_how_to_create_it_and_deploys_nothing(account, capsys):
    scf, deployed = account
    scf.roles.discard("SCF_QcsRole")
    assert main(["infra", "up", "--provider", "tencent", "--region", "ap-guangzhou", "--ssh-cidr", "203.0.113.7/32"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "no SCF_QcsRole" in err and "console.cloud.tencent.com/scf" in err and "infra up --provider tencent" in err
    assert deployed == []
    assert [c["action"] for c in scf.calls] == ["GetRole"]


def test_infra_up_with_the_role_goes_on_to_the_deployment(account, capsys):
    scf, deployed = account
    assert main(["infra", "up", "--provider", "tencent", "--region", "ap-guangzhou", "--ssh-cidr", "203.0.113.7/32"]) == 2
    assert "the deployment was reached" in capsys.readouterr().err
    assert deployed == ["stack"] and [c["action"] for c in scf.calls] == ["GetRole"]


def test_without_the_cloud_driver_no_role_is_asked_for(account, capsys):
    scf, deployed = account
    scf.roles.discard("SCF_QcsRole")
    assert main(["infra", "up", "--provider", "tencent", "--region", "ap-guangzhou", "--ssh-cidr", "203.0.113.7/32",
                 "--set", "driverPackage="]) == 2
    assert "the deployment was reached" in capsys.readouterr().err
    assert scf.calls == []
