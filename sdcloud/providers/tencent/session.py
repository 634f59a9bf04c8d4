"""Shared Tencent Cloud plumbing for the CVM adapter (compute.py), the catalog (catalog.py) and the bill (billing.py).

Credentials (environment, the SDK's profile file, the CVM role), the endpoint override that the
tests and private endpoints use, one CVM client per region, and the bounded retry of throttling and
network blips live here, so that none of the other Tencent modules imports another's internals.
Every retry is reported as a `retry` event of the run.

The SDK is imported lazily: `sdcloud --help` must not pay for it.
"""

from __future__ import annotations

import os
import urllib.request
from typing import Any
from urllib.parse import urlparse

from ...errors import UserError
from ...events import Kind
from . import errors as codes
from ..base import CredentialsError, EventSink, ProviderError, no_events
from ..traits import name_of

NAME = name_of(__name__)  # "tencent", or the name a copy of this folder is registered under
API_VERSION = "2017-03-12"
ENDPOINT_ENV = "SDCLOUD_TENCENT_ENDPOINT"
# The CVM metadata service hands out CAM role credentials on a CVM host.
METADATA_URL = "http://metadata.tencentyun.com/latest/meta-data/"
# What each RunInstances error code means for the launch: sdcloud/providers/tencent/errors.py.
RETRY_PREFIXES = ("RequestLimitExceeded", "ClientNetworkError", "ServerNetworkError", "InternalError")


def _num(value: Any) -> float | None:
    """A number that may arrive as a string, or not at all."""
    if value in (None, ""):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def endpoint_override() -> tuple[str, str] | None:
    """(scheme, host[:port]) from SDCLOUD_TENCENT_ENDPOINT, or None for the SDK's default endpoint."""
    raw = os.environ.get(ENDPOINT_ENV, "").strip()
    if not raw:
        return None
    url = urlparse(raw)
    if url.scheme not in ("http", "https") or not url.hostname or url.path not in ("", "/") or url.query:
        raise UserError(f"{ENDPOINT_ENV} must look like http://host:port or https://host, got {raw!r}")
    return url.scheme, url.netloc


def _cvm_role() -> str | None:
    """The CAM role of this CVM host, or None when not on a CVM (asked with a short timeout)."""
    try:
        with urllib.request.urlopen(METADATA_URL + "cam/security-credentials/", timeout=1) as resp:
            role = resp.read().decode().strip()
            return role.splitlines()[0] if role else None
    except (OSError, ValueError):
        return None


def credentials():
    """SDK credentials: environment, then the SDK's profile file, then the CVM role; one clear line if none."""
    from tencentcloud.common import credential
    from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException

    sid, skey = os.environ.get("TENCENTCLOUD_SECRET_ID", ""), os.environ.get("TENCENTCLOUD_SECRET_KEY", "")
    try:
        if sid or skey:
            if not (sid and skey):
                missing = "TENCENTCLOUD_SECRET_KEY" if sid else "TENCENTCLOUD_SECRET_ID"
                raise CredentialsError(f"{missing} is not set, but its partner is: set both, or neither")
            return credential.Credential(sid, skey, os.environ.get("TENCENTCLOUD_SESSION_TOKEN") or None)
        cred = credential.ProfileCredential().get_credential()
        if cred is not None:
            return cred
    except TencentCloudSDKException as exc:
        raise CredentialsError(f"Tencent Cloud credentials are not usable: {exc.message}") from None
    role = _cvm_role()
    if role:
        cred = credential.CVMRoleCredential(role)
        cred._role_endpoint = METADATA_URL + "cam/security-credentials/"  # the service we just asked
        if cred.get_credential() is None:
            raise CredentialsError(f"the CVM role {role!r} gave no credentials: check the role's trust policy")
        return cred
    raise CredentialsError("no Tencent Cloud credentials: set TENCENTCLOUD_SECRET_ID and TENCENTCLOUD_SECRET_KEY, "
                           "write ~/.tencentcloud/credentials, or run on a CVM with a CAM role")


def _code(exc: Exception) -> str:
    return str(getattr(exc, "code", "") or "")


def _retryable(exc: BaseException) -> bool:
    return _code(exc).startswith(RETRY_PREFIXES)


class Session:
    """Credentials and one CVM client per region, and `call`: one API call with bounded retries."""

    def __init__(self, max_attempts: int = 6, backoff: float = 1.0, backoff_max: float = 20.0,
                 request_timeout: int = 30):
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.request_timeout = request_timeout
        self._cred = None
        self._clients: dict[str, Any] = {}

    def check_credentials(self) -> None:
        """Raise CredentialsError (one line) now, before a run is created, when none can be found."""
        if self._cred is None:
            self._cred = credentials()

    def _client(self, region: str):
        client = self._clients.get(region)
        if client is None:
            from tencentcloud.common.profile.client_profile import ClientProfile
            from tencentcloud.common.profile.http_profile import HttpProfile
            from tencentcloud.cvm.v20170312 import cvm_client

            if self._cred is None:
                self._cred = credentials()
            override = endpoint_override()
            if override:
                http = HttpProfile(protocol=override[0], endpoint=override[1], reqTimeout=self.request_timeout)
            else:
                http = HttpProfile(reqTimeout=self.request_timeout)
            client = cvm_client.CvmClient(self._cred, region, ClientProfile(httpProfile=http, language="en-US"))
            self._clients[region] = client
        return client

    def call(self, region: str, action: str, params: dict, events: EventSink = no_events) -> dict:
        """One API call; throttling and network blips are retried, bounded, with exponential backoff."""
        from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException
        from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential, wait_random

        def report(state) -> None:
            exc = state.outcome.exception()
            events(Kind.RETRY, {"provider": NAME, "region": region, "action": action, "code": _code(exc),
                                "attempt": state.attempt_number, "wait_s": round(state.next_action.sleep, 3)})

        client = self._client(region)
        try:
            for attempt in Retrying(retry=retry_if_exception(_retryable), stop=stop_after_attempt(self.max_attempts),
                                    wait=(wait_exponential(multiplier=self.backoff, max=self.backoff_max)
                                          + wait_random(0, self.backoff)),
                                    before_sleep=report, reraise=True):
                with attempt:
                    return client.call_json(action, params)["Response"]
        except TencentCloudSDKException as exc:
            code = _code(exc)
            if code in codes.ROLE:  # the host's role, not the caller's credentials
                role = repr(params["CamRoleName"]) if params.get("CamRoleName") else "of the launch template"
                raise UserError(f"{codes.ROLE[code].format(role=role)} ({code})") from None
            if code == "AuthFailure.UnauthorizedOperation":  # CAM refused the action: the keys are good
                raise UserError(f"Tencent Cloud denied {action} ({code}): {exc.message.splitlines()[0]}; grant it in the "
                                f"CAM policy of these keys") from None
            if code.startswith("AuthFailure"):
                raise CredentialsError(f"Tencent Cloud rejected the credentials ({code}): {exc.message}") from None
            if code.startswith("UnauthorizedOperation"):
                raise UserError(f"Tencent Cloud denied {action} ({code}): grant the CAM policy QcloudCVMFullAccess "
                                f"or an equivalent one") from None
            if _retryable(exc):
                raise ProviderError(f"Tencent Cloud {action} in {region} failed after {self.max_attempts} tries: "
                                    f"{code}: {exc.message}") from exc
            raise
        raise AssertionError("unreachable")
