"""Transient faults (docs/runs.md, "Store faults"): which errors are worth another try, and how
long to wait before it.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from .base import Cancelled, NotFound, StoreError


# botocore retries a request (5 attempts, standard mode), but not the reading of its body: a reset
# or a short body while reading get_object()["Body"] raises ResponseStreamingError out of read().
# Every S3Store call therefore runs inside `with_retries`, request and body read together, with a
# bounded, jittered backoff. (A plain loop, not tenacity: the agent's wheel depends on boto3 only.)

# Codes that say "try again later": throttling, a server's own error, a request that timed out.
TRANSIENT_CODES = frozenset({
    "SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "RequestTimeTooSkewed", "Throttling",
    "ThrottlingException", "RequestLimitExceeded", "TooManyRequests", "OperationAborted", "BadGateway",
    "GatewayTimeout", "500", "502", "503", "504", "429"})
# Codes that the next request, and the next host with the same grant, would meet again.
PERMANENT_CAUSES = {
    "AccessDenied": "permission-denied", "InvalidAccessKeyId": "permission-denied",
    "SignatureDoesNotMatch": "permission-denied", "AllAccessDisabled": "permission-denied",
    "AccountProblem": "permission-denied", "InvalidToken": "permission-denied", "403": "permission-denied",
    "NoSuchBucket": "no-bucket",
}


@dataclass(frozen=True)
class RetryPolicy:
    """At most `attempts` tries and `deadline` seconds per operation; full-jitter exponential backoff."""
    attempts: int = 6
    base_delay: float = 0.25
    max_delay: float = 4.0
    deadline: float = 90.0

    def delay(self, retry: int, rng: random.Random = random.Random()) -> float:
        return rng.uniform(self.base_delay / 2, min(self.max_delay, self.base_delay * 2 ** retry))


DEFAULT_RETRY = RetryPolicy()


def error_code(exc: BaseException) -> str:
    """The S3 error code of a botocore ClientError (or of the error it wraps), else ''."""
    seen = 0
    while exc is not None and seen < 5:
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            err = response.get("Error") or {}
            code = str(err.get("Code") or "")
            if not code:
                code = str((response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or "")
            if code:
                return code
        # __cause__ only: an error raised while handling another (a read-back after a 412) is its own.
        exc, seen = exc.__cause__, seen + 1
    return ""


def is_transient(exc: BaseException) -> bool:
    """A fault that a later try may not meet: throttling, a 5xx, a reset, a short body, a stall."""
    import http.client

    if isinstance(exc, (Cancelled, NotFound)):
        return False
    code = error_code(exc)
    if code:
        return code in TRANSIENT_CODES or (code.isdigit() and (int(code) >= 500 or int(code) == 429))
    try:
        from botocore import exceptions as bx
        if isinstance(exc, (bx.ConnectionError, bx.HTTPClientError, bx.IncompleteReadError)):
            return True
    except ImportError:  # a LocalStore-only process
        pass
    try:
        from urllib3 import exceptions as ux
        if isinstance(exc, (ux.ProtocolError, ux.ReadTimeoutError, ux.SSLError)):
            return True
    except ImportError:
        pass
    from ..transfer import ShortRead
    return isinstance(exc, (http.client.IncompleteRead, ConnectionError, TimeoutError, ShortRead))


def failure_cause(exc: BaseException) -> str | None:
    """`permission-denied` or `no-bucket` for a refusal that will recur on the next host, else None."""
    return PERMANENT_CAUSES.get(error_code(exc))


# Why an attempt ended, as the agent reports it in status.json (`failure_cause`); the first three
# recur on the next host (the same grant, the same bucket, the same config), so the run ends there.
RECURRING_CAUSES = ("permission-denied", "no-bucket", "bad-config")


def attempt_cause(exc: BaseException) -> str:
    """The cause an exception stands for: a refusal that recurs, a store that stayed unreachable
    (`store-unreachable`: its faults outlasted the retries) or refused otherwise (`store-refused`),
    a bad store configuration, or `agent-error`."""
    cause = failure_cause(exc)
    if cause:
        return cause
    if isinstance(exc, StoreError) or is_transient(exc):
        return "store-unreachable"
    if error_code(exc):
        return "store-refused"
    if isinstance(exc, ValueError):
        return "bad-config"
    return "agent-error"


def describe_failure(exc: BaseException, where: str = "") -> str:
    """One line for a store error: `AccessDenied (Access Denied) on PutObject of s3://...`."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and response.get("Error"):
        err = response["Error"]
        op = getattr(exc, "operation_name", "") or "a request"
        text = f"{err.get('Code')} ({err.get('Message') or 'no message'}) on {op}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return f"{text} at {where}" if where else text


def with_retries(fn: Callable[[], Any], what: str, policy: RetryPolicy = DEFAULT_RETRY,
                 log: Callable[[str], None] | None = None) -> Any:
    """fn() again after a transient fault, within the policy's bounds. A refusal (403, 404, 412) is
    not retried; a fault still there at the end becomes a StoreError that names it."""
    start = time.monotonic()
    for i in range(policy.attempts):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - sorted by is_transient
            if not is_transient(exc):
                raise
            delay = policy.delay(i)
            if i == policy.attempts - 1 or time.monotonic() - start + delay > policy.deadline:
                raise StoreError(f"{what} failed after {i + 1} attempts: {type(exc).__name__}: {exc}") from exc
            (log or _log_retry)(f"{what}: {type(exc).__name__}: {exc}; retry {i + 1} in {delay:.2f}s")
            time.sleep(delay)
    raise AssertionError("unreachable")


def _log_retry(msg: str) -> None:
    import logging
    logging.getLogger("sdcloud_agent.store").info("%s", msg)



def retry(fn: Callable[[], Any], *, attempts: int = 5, base_delay: float = 0.5, max_delay: float = 8.0,
          log: Callable[[str], None] | None = None, what: str = "",
          stop: threading.Event | None = None) -> Any:
    """Call fn with bounded retries and exponential backoff; Cancelled is never retried."""
    for i in range(attempts):
        try:
            return fn()
        except Cancelled:
            raise
        except Exception as exc:  # noqa: BLE001 - the store raises many kinds; all are retryable here
            if i == attempts - 1:
                raise StoreError(f"{what or 'store operation'} failed after {attempts} attempts: {exc}") from exc
            delay = min(max_delay, base_delay * 2 ** i)
            if log:
                log(f"{what or 'store operation'} failed ({exc}); retry {i + 1}/{attempts - 1} in {delay:.1f}s")
            if stop is not None and stop.wait(delay):
                raise Cancelled(what) from exc
            elif stop is None:
                time.sleep(delay)
    raise AssertionError("unreachable")
