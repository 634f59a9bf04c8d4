"""Shared AWS plumbing for the EC2 adapter (compute.py) and the catalog refresh (catalog.py).

Sessions on the standard credential chain, one client configuration, the error-code helpers and the
retry policy live here so that neither AWS module imports the other.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError, ClientError, ConnectionClosedError, ConnectTimeoutError, EndpointConnectionError, NoCredentialsError,
    ReadTimeoutError,
)
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from ...errors import UserError
from ...events import Kind
from ..base import CredentialsError, EventSink, ProviderError, no_events
from ..traits import name_of

NAME = name_of(__name__)  # "aws", or the name a copy of this folder is registered under

THROTTLE_CODES = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException", "RequestThrottled",
                            "RequestThrottledException", "TooManyRequestsException", "SlowDown",
                            "EC2ThrottledException", "ServiceUnavailable", "Unavailable", "InternalError"})
AUTH_CODES = frozenset({"AuthFailure", "UnauthorizedOperation", "OptInRequired", "InvalidClientTokenId",
                        "SignatureDoesNotMatch", "ExpiredToken", "RequestExpired", "UnrecognizedClientException",
                        "AccessDenied", "AccessDeniedException"})

T = TypeVar("T")


def error_code(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def error_message(exc: BaseException, limit: int = 300) -> str:
    if isinstance(exc, ClientError):
        text = str(exc.response.get("Error", {}).get("Message", "")) or str(exc)
    else:
        text = str(exc)
    # Authorization failures carry a long encoded blob: keep the line readable.
    return text if len(text) <= limit else text[:limit] + "..."


# Network failures are retried too: RunInstances repeats its ClientToken, so a retry after a lost
# answer gets the instance that was started, not a second one.
_NETWORK_ERRORS = (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError)


def is_retryable(exc: BaseException) -> bool:
    return error_code(exc) in THROTTLE_CODES or isinstance(exc, _NETWORK_ERRORS)


def region_of_zone(zone: str) -> str:
    return zone[:-1] if zone and zone[-1].isalpha() else zone


def check_region(region: str) -> str:
    parts = region.split("-")
    if len(parts) < 3 or not parts[-1].isdigit() or not all(p.isalpha() and p.islower() for p in parts[:-1]):
        raise UserError(f"not an AWS region name: {region!r} (e.g. us-east-1)")
    return region


_LOADER = None


def _botocore_session():
    """A fresh botocore session that shares one model loader: parsing the EC2 model costs ~0.5 s a session."""
    global _LOADER
    import botocore.session

    core = botocore.session.Session()
    if _LOADER is None:
        _LOADER = core.get_component("data_loader")
    else:
        core.register_component("data_loader", _LOADER)
    return core


def new_session(region: str | None = None, profile: str | None = None) -> boto3.session.Session:
    """A boto3 session on the standard credential chain; no credentials is one clear line."""
    try:
        session = boto3.session.Session(profile_name=profile, region_name=region, botocore_session=_botocore_session())
    except BotoCoreError as exc:  # e.g. a profile that does not exist
        raise CredentialsError(f"AWS credentials: {exc}") from None
    if session.get_credentials() is None:
        raise CredentialsError("no AWS credentials found: set AWS_PROFILE (aws configure / aws sso login) "
                               "or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    return session


# Retries belong to tenacity (so that each is reported); botocore tries each call once.
CLIENT_CONFIG = Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=10, read_timeout=60,
                       user_agent_extra="sdcloud")


class Retry:
    """Bounded exponential backoff with jitter for throttling and lost connections, reporting each retry."""

    def __init__(self, attempts: int = 6, base: float = 0.5, cap: float = 20.0):
        self.attempts, self.base, self.cap = attempts, base, cap

    def call(self, fn: Callable[[], T], what: str, events: EventSink = no_events, **info: Any) -> T:
        def report(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            code = (error_code(exc) or type(exc).__name__) if exc else ""
            events(Kind.RETRY, {"provider": NAME, "call": what, "attempt": state.attempt_number, "code": code,
                                "wait_s": round(state.upcoming_sleep, 3), **info})

        retrying = Retrying(retry=retry_if_exception(is_retryable), stop=stop_after_attempt(self.attempts),
                            wait=wait_random_exponential(multiplier=self.base, max=self.cap),
                            before_sleep=report, reraise=True)
        try:
            return retrying(fn)
        except NoCredentialsError:
            raise CredentialsError("no AWS credentials found: set AWS_PROFILE (aws configure / aws sso login) "
                                   "or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY") from None
        except ClientError as exc:
            code = error_code(exc)
            if code in THROTTLE_CODES:
                raise ProviderError(f"AWS {what}: still throttled ({code}) after {self.attempts} tries") from exc
            if code in AUTH_CODES:
                raise UserError(f"AWS {what} denied ({code}): {error_message(exc)}") from None
            raise
        except BotoCoreError as exc:  # the network, after the last try, or a bad parameter
            raise ProviderError(f"AWS {what}: {exc}") from exc


# Service Quotas codes, per market and instance family letter (the quotas count vCPUs).
_QUOTAS = {
    ("spot", "g"): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("spot", "p"): ("L-7212CCBC", "All P Spot Instance Requests"),
    ("on-demand", "g"): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("on-demand", "p"): ("L-417A185B", "Running On-Demand P instances"),
}


def quota_message(code: str, region: str, instance_type: str, market: str, detail: str) -> str:
    family = instance_type[:1].lower()
    quota = _QUOTAS.get((market, family))
    if quota:
        qcode, qname = quota
        how = (f"raise the quota '{qname}' ({qcode}, counted in vCPUs) in {region}: Service Quotas console, or "
               f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {qcode} "
               f"--desired-value <vCPUs> --region {region}")
    else:
        how = f"raise the EC2 instance quota for {instance_type} in {region} in the Service Quotas console"
    return f"AWS quota reached ({code}) launching {market} {instance_type} in {region}: {how} ({detail})"
