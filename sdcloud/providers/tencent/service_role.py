"""What a Tencent account must have before `sdcloud infra up --provider tencent` deploys: SCF's service role.

The stack creates the cloud driver's function from its code in the bucket (CloudFunction.code_from_bucket:
the zip is over SCF's inline limit). SCF reads code from COS only through its service role
`SCF_QcsRole`, which an account has only once someone authorized SCF's service in the console (or
created the role with CAM). A fresh account has not, and the deployment would fail late, half made,
with the function missing. So `infra up` asks CAM first (GetRole, CAM API 2019-01-16) and, where the
role is missing, says in one line how to create it.
"""

from __future__ import annotations

from typing import Any

from ...errors import UserError
from .session import credentials, endpoint_override

ROLE = "SCF_QcsRole"
SERVICE, VERSION = "cam", "2019-01-16"
HOW = (f"the Tencent account has no {ROLE}, the service role SCF reads the cloud driver's code from COS "
       "with: authorize it once (open https://console.cloud.tencent.com/scf and accept the service "
       "authorization it asks for, which creates the role), then run `sdcloud infra up --provider tencent` again")


def _client(region: str, client: Any) -> Any:
    if client is not None:
        return client
    from tencentcloud.common.common_client import CommonClient
    from tencentcloud.common.profile.client_profile import ClientProfile
    from tencentcloud.common.profile.http_profile import HttpProfile

    override = endpoint_override()
    http = HttpProfile(protocol=override[0], endpoint=override[1]) if override else HttpProfile()
    return CommonClient(SERVICE, VERSION, credentials(), region, ClientProfile(httpProfile=http, language="en-US"))


def check(region: str, client: Any = None) -> None:
    """UserError (one line) when the account lacks SCF_QcsRole; nothing when it has it. A refusal to
    look (no cam:GetRole for these keys) is said too: the deployment would need the role anyway."""
    from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException

    try:
        _client(region, client).call_json("GetRole", {"RoleName": ROLE})
    except TencentCloudSDKException as exc:
        code = str(exc.code or "")
        if code.startswith("ResourceNotFound") or "NotExist" in code:
            raise UserError(HOW) from None
        raise UserError(f"cannot check the account's {ROLE} (CAM GetRole: {code}: {exc.message}); it needs "
                        f"cam:GetRole, or check in the CAM console that {ROLE} exists") from None
