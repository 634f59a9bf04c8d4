"""Vast.ai's REST API (https://console.vast.ai/api/v0/), as vast-cli (vast-ai/vast-cli, vast.py) calls it.

The key: `VAST_API_KEY`, else `[vast] api_key` in config.toml; sent as `Authorization: Bearer <key>` on
every call, never in a URL (vast.py's older `?api_key=` form would put it in proxies' logs). The key is
never logged, stored or put in an error message. A 429 (the API's rate limit) and a 5xx are retried a
bounded number of times with backoff (tenacity); any other error is raised as VastApiError at once.
`SDCLOUD_VAST_ENDPOINT` points the client elsewhere (a private mirror; the tests' fake), over HTTPS too.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from ... import config
from ..base import CredentialsError, ProviderError
from ..traits import name_of

NAME = name_of(__name__)
API = "https://console.vast.ai/api/v0"
ENDPOINT_ENV = "SDCLOUD_VAST_ENDPOINT"
KEY_ENV = "VAST_API_KEY"
RETRY_STATUSES = (429, 500, 502, 503, 504)
MAX_ATTEMPTS = 6


class VastApiError(ProviderError):
    """An answer of the API that is not a success: its HTTP status and the API's own message."""

    def __init__(self, status: int, message: str, path: str = ""):
        super().__init__(f"Vast.ai API {status} on {path}: {message}" if path else f"Vast.ai API {status}: {message}")
        self.status = status
        self.message = message


def api_key() -> str | None:
    """The user's key: the environment first, then config.toml's [vast] api_key."""
    found = os.environ.get(KEY_ENV) or (config.settings().get(NAME) or {}).get("api_key")
    return str(found) if found else None


def require_key() -> str:
    key = api_key()
    if not key:
        raise CredentialsError(f"no Vast.ai API key: set {KEY_ENV} or api_key in the [{NAME}] section of config.toml")
    return key


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, VastApiError) and exc.status in RETRY_STATUSES


@dataclass
class Client:
    """One caller of the API; `calls` counts requests (the tests read the fake's own log instead)."""

    key: str | None = None
    base: str = field(default_factory=lambda: os.environ.get(ENDPOINT_ENV) or API)
    timeout: float = 30.0
    backoff: float = 1.0  # seconds, doubled per retry, capped at backoff_max
    backoff_max: float = 30.0
    max_attempts: int = MAX_ATTEMPTS

    def __post_init__(self) -> None:
        if not self.base.startswith("https://"):
            raise ProviderError(f"{ENDPOINT_ENV} must be an https:// URL")

    def _send(self, method: str, path: str, query: dict | None, body: dict | None) -> dict:
        key = self.key or require_key()
        url = self.base.rstrip("/") + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method,
                                     headers={"Authorization": f"Bearer {key}", "Accept": "application/json",
                                              **({"Content-Type": "application/json"} if data is not None else {})})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=ssl.create_default_context()) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                msg = json.loads(raw or b"{}").get("msg") or json.loads(raw or b"{}").get("error") or exc.reason
            except ValueError:
                msg = exc.reason
            raise VastApiError(exc.code, str(msg), path) from None
        except (urllib.error.URLError, OSError) as exc:
            raise VastApiError(503, f"unreachable: {getattr(exc, 'reason', exc)}", path) from None
        return json.loads(raw) if raw else {}

    def call(self, method: str, path: str, query: dict | None = None, body: dict | None = None) -> dict:
        """One API call, its 429s and 5xx retried (at most `max_attempts` tries in all)."""
        from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

        for attempt in Retrying(retry=retry_if_exception(_retryable), stop=stop_after_attempt(self.max_attempts),
                                wait=wait_exponential(multiplier=self.backoff, max=self.backoff_max), reraise=True):
            with attempt:
                return self._send(method, path, query, body)
        raise AssertionError("unreachable")  # Retrying reraises the last error

    # The calls sdcloud makes, named as vast.py names them.
    def search_offers(self, query: dict) -> list[dict]:
        """`search offers`: GET /bundles/?q=<the JSON filter> (vast.py search__offers)."""
        return list(self.call("GET", "/bundles/", {"q": json.dumps(query)}).get("offers") or [])

    def create_instance(self, offer_id: int | str, body: dict) -> int:
        """`create instance`: PUT /asks/{id}/; the new instance's id ({"success": true, "new_contract": id})."""
        answer = self.call("PUT", f"/asks/{offer_id}/", body=body)
        if not answer.get("success") or "new_contract" not in answer:
            raise VastApiError(400, str(answer.get("msg") or answer.get("error") or "create refused"), f"/asks/{offer_id}/")
        return int(answer["new_contract"])

    def instances(self) -> list[dict]:
        """`show instances`: GET /instances/?owner=me."""
        return list(self.call("GET", "/instances/", {"owner": "me"}).get("instances") or [])

    def instance(self, instance_id: int | str) -> dict | None:
        """`show instance`: GET /instances/{id}/ ({"instances": {...}}); None once it is gone."""
        try:
            found = self.call("GET", f"/instances/{instance_id}/", {"owner": "me"}).get("instances")
        except VastApiError as exc:
            if exc.status == 404:
                return None
            raise
        return found or None

    def change_bid(self, instance_id: int | str, price: float) -> None:
        """`change bid`: PUT /instances/bid_price/{id}/ {"client_id": "me", "price": $/h}."""
        self.call("PUT", f"/instances/bid_price/{instance_id}/", body={"client_id": "me", "price": price})

    def destroy(self, instance_id: int | str) -> None:
        """`destroy instance`: DELETE /instances/{id}/ (a gone instance is already what was asked)."""
        try:
            self.call("DELETE", f"/instances/{instance_id}/", body={})
        except VastApiError as exc:
            if exc.status != 404:
                raise

    def invoices(self, start: float, end: float) -> list[dict]:
        """`show invoices`: GET /users/me/invoices (charges per instance: GPU, storage, bandwidth)."""
        answer = self.call("GET", "/users/me/invoices", {"owner": "me", "sdate": int(start), "edate": int(end),
                                                          "inc_charges": "true"})
        return list(answer.get("invoices") or [])


def _check_key(value: object, what: str) -> str:
    from ...errors import UserError

    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{what} must be the Vast.ai API key (a string)")
    return value


# [vast] keys beyond the settings (traits.settings: bid_margin, reliability_floor): checked before a run.
CONFIG_KEYS = {"api_key": _check_key}
