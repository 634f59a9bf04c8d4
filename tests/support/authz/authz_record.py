"""Records the AWS API calls made in a test process, each with the principal that makes it in production.

The principal is read off the call's stack: the cloud driver's handler (sdcloud.driver.unattended)
anywhere on it makes it the function's role; else the outermost sdcloud code decides (the control
plane calls the agent's store too, and is still the user): the agent's batch worker
(sdcloud_agent.batch) and the agent (sdcloud_agent) hold the host role; the controller's run code
(sdcloud.runs) and everything else of sdcloud (up, infra, gc, the CLI) the user's own keys. A call
from test code alone is the test's setup ("setup"), made as the account owner; one from a transfer
thread (s3transfer's pool) has no sdcloud frame: it is the principal of the thread that made its
transfer task (each s3transfer Task carries its maker's principal into the thread that runs it), or
"thread" where none is known.

Where a test hands a principal its own keys (moto with IAM enforced), the access key that signs the
request decides first: `as_principal(key_id, principal)` registers it, and the key is what the cloud
itself goes by. The key is kept on the call, never written to the log.

`record_calls(monkeypatch)` records in one test; `SDCLOUD_AUTHZ_LOG=<dir>` makes tests/conftest.py
record every call of a whole run, one JSON line per call, in one file per worker (authz_log()).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

# (module prefix, principal), the more specific first: the outermost sdcloud frame's module takes
# the first prefix that names it.
DRIVER = "sdcloud.driver.unattended"
PRINCIPALS = (
    ("sdcloud_agent.batch", "batch-worker"),
    ("sdcloud_agent", "host"),
    ("sdcloud.runs", "controller"),
    ("sdcloud", "user"),
)
# Access key id -> principal, for keys a test made for one principal (moto_iam.keys_for).
KEYS: dict[str, str] = {}
_TASK = threading.local()  # the principal of the s3transfer task this thread runs


def as_principal(key_id: str, principal: str) -> None:
    KEYS[key_id] = principal


@dataclass
class Call:
    principal: str
    service: str
    operation: str
    params: dict
    ok: bool = True
    result: dict = field(default_factory=dict)  # what a later call's authorization depends on
    error: str = ""  # the service's error code when the call failed (a 404 is still authorized first)
    key: str = field(default="", repr=False)  # the access key id that signed it (not logged)


def principal_of_stack() -> str:
    task = getattr(_TASK, "principal", None)
    if task:
        return task
    modules = []
    frame = sys._getframe(1)
    while frame is not None:
        modules.append(frame.f_globals.get("__name__", ""))
        frame = frame.f_back
    if any(m == DRIVER or m.startswith(DRIVER + ".") for m in modules):
        return "driver"
    ours = [m for m in modules if m.split(".")[0] in ("sdcloud", "sdcloud_agent")]
    if not ours:
        return "setup" if threading.current_thread() is threading.main_thread() else "thread"
    outermost = ours[-1]
    return next(p for prefix, p in PRINCIPALS if outermost == prefix or outermost.startswith(prefix + "."))


def _summary(operation: str, response: dict) -> dict:
    if operation == "RunInstances":
        return {"InstanceIds": [i["InstanceId"] for i in response.get("Instances", [])]}
    return {}


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return f"<{type(value).__name__}>"  # bodies and streams: their size is not an authorization matter


def _key_of(client) -> str:
    credentials = getattr(client._request_signer, "_credentials", None)
    return (credentials.access_key or "") if credentials is not None else ""


def _carry_principal(patch) -> None:
    """An s3transfer Task runs in the transfer's pool: it takes its maker's principal there."""
    from s3transfer.tasks import Task

    init, run = Task.__init__, Task.__call__

    def made(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._sdcloud_principal = principal_of_stack()

    def called(self, *args, **kwargs):
        before = getattr(_TASK, "principal", None)
        _TASK.principal = getattr(self, "_sdcloud_principal", None) or before
        try:
            return run(self, *args, **kwargs)
        finally:
            _TASK.principal = before

    patch(Task, "__init__", made)
    patch(Task, "__call__", called)


def install(sink, patch, principal: str | None = None) -> None:
    """Wrap botocore's one entry point for API calls; each call goes to `sink(Call)`. `principal`:
    every call of this process is that principal's (a host agent's own process)."""
    import botocore.client

    original = botocore.client.BaseClient._make_api_call
    _carry_principal(patch)

    def recording(self, operation_name, api_params):
        key = _key_of(self)
        call = Call(principal or KEYS.get(key) or principal_of_stack(), self.meta.service_model.endpoint_prefix,
                    operation_name, _jsonable(dict(api_params)), key=key)
        try:
            response = original(self, operation_name, api_params)
        except Exception as exc:
            call.ok = False
            call.error = str(getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__))
            sink(call)
            raise
        call.result = _summary(operation_name, response)
        sink(call)
        return response

    patch(botocore.client.BaseClient, "_make_api_call", recording)


def record_calls(monkeypatch) -> list[Call]:
    calls: list[Call] = []
    install(calls.append, monkeypatch.setattr)
    return calls


def authz_log(directory: str | Path, worker: str):
    """A sink that appends each call as one JSON line to <directory>/calls-<worker>.jsonl."""
    path = Path(directory) / f"calls-{worker}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)

    def sink(call: Call) -> None:
        with path.open("a") as f:
            kept = {k: v for k, v in asdict(call).items() if k != "key"}
            f.write(json.dumps({**kept, "test": os.environ.get("PYTEST_CURRENT_TEST", "")}) + "\n")
    return sink


def read_log(directory: str | Path) -> list[Call]:
    """Every call a log holds (all its workers' and processes' files)."""
    fields = set(Call.__dataclass_fields__)
    return [Call(**{k: v for k, v in json.loads(line).items() if k in fields})
            for path in sorted(Path(directory).glob("calls-*.jsonl")) for line in path.read_text().splitlines()]


def summary(directory: str | Path) -> dict[str, list[str]]:
    """Each principal's distinct calls in a log: {"user": ["ec2:DescribeInstances", ...], ...}."""
    seen: dict[str, set[str]] = {}
    for path in sorted(Path(directory).glob("calls-*.jsonl")):
        for line in path.read_text().splitlines():
            call = json.loads(line)
            seen.setdefault(call["principal"], set()).add(f"{call['service']}:{call['operation']}")
    return {p: sorted(v) for p, v in sorted(seen.items())}


if __name__ == "__main__":  # python tests/support/authz/authz_record.py <log dir>: the calls each principal made
    for principal, calls in summary(sys.argv[1]).items():
        print(f"{principal}: {', '.join(calls)}")
