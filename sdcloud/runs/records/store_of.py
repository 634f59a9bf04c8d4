"""The bucket that holds a run's or a batch job's history, found from its row in the state store.

`logs` reads the hosts' logs from it, `status` the host's status.json, `watch --drive`, `resume` and
`down` the journal. A run rebuilt on a second machine with `sdcloud status RUN --store URL` is
reached by that URL ever after ($SDCLOUD_HOME/stores.json), opened with the credentials of its
cloud (`cos://` with the Tencent keys), even where this machine would name another bucket for it
(a local run's bucket is a folder of the machine that made it).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ... import config
from ...errors import UserError


def _memo() -> Path:
    return config.home() / "stores.json"


def remembered(run_id: str) -> dict | None:
    """The store config this machine reached `run_id` by (status --store), or None."""
    try:
        return json.loads(_memo().read_text()).get(run_id)
    except (OSError, ValueError, AttributeError):
        return None


def remember(run_id: str, conf: dict) -> None:
    try:
        memo = json.loads(_memo().read_text())
    except (OSError, ValueError):
        memo = {}
    memo[run_id] = conf
    fd, tmp = tempfile.mkstemp(dir=config.home(), prefix=".stores-")
    with os.fdopen(fd, "w") as f:
        json.dump(memo, f, indent=1)
    os.replace(tmp, _memo())


def run_store_conf(spec: Any, infra: dict | None, run_id: str) -> dict:
    """The store config a controller here uses for a training run: the one its spec and stack name,
    unless this machine reached the run by another URL (then that one)."""
    from .store import store_config

    seen = remembered(run_id)
    try:
        # A --store URL in a provider's own dialect (cos://) is opened as that provider opens its bucket.
        conf = url_conf(spec.store, spec.region) if _dialect_url(spec.store) else \
            store_config(spec.provider, spec.store, spec.region, infra)
    except UserError:
        if seen:
            return seen
        raise
    if seen and str(seen.get("url", "")).rstrip("/") != str(conf.get("url", "")).rstrip("/"):
        return seen
    return conf


def store_of(run: dict):
    """The open store of `run` (a row of the runs table): a batch job's spec holds its store's config
    itself; a training run's comes from its spec and the stack's outputs saved on this machine."""
    from ...offers.kinds import RunKind
    from .run_spec import RunSpec
    from .state import StateStore, run_kind
    from .store import open_run_store

    if run_kind(run) is RunKind.BATCH:
        return open_run_store(run["spec"]["store"])
    spec = RunSpec(**run["spec"])
    return open_run_store(run_store_conf(spec, StateStore().infra(spec.provider, spec.region or ""), run["id"]))


def _dialect_of(url: str | None) -> Any:
    """The provider traits whose own bucket dialect a URL's scheme names (cos://), or None (s3://, file://)."""
    from urllib.parse import urlparse

    from ...providers.traits import every

    from sdcloud_agent.store import dialects

    scheme = urlparse(url or "").scheme
    if scheme == "" or scheme in dialects.GENERIC:
        return None
    return next((t for t in every() if scheme in t.stores and t.run_store), None)


def _dialect_url(url: str | None) -> bool:
    return _dialect_of(url) is not None


def url_conf(url: str, region: str | None = None) -> dict:
    """The store config of a bucket URL the user typed: a scheme that is a provider's own bucket
    dialect (`cos://`) in that dialect, opened with this machine's keys for that cloud."""
    from ...providers.loader import run_store

    from .store_urls import check_store_url
    from .store import store_config

    url = check_store_url(url)
    t = _dialect_of(url)
    if t is None:
        return store_config("local", url, None, None)
    region = region or (os.environ.get(t.region_env) if t.region_env else None) or t.default_region
    dialect = run_store(t.name)
    assert dialect is not None  # _dialect_of found a provider that declares one
    return dialect.run_store_config({"url": url}, {}, region)


def open_checked(conf: dict):
    """Open a store and read from it once: missing or refused credentials are one line, not a traceback."""
    from .store import StoreError, open_run_store

    try:
        store = open_run_store(conf)
        store.list("drivers/active/")
    except UserError:
        raise
    except (StoreError, OSError, ValueError) as exc:
        raise UserError(f"cannot read {conf.get('url')}: {_first_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - the SDKs' credential errors are theirs (botocore, COS)
        raise UserError(f"cannot read {conf.get('url')}: {_first_line(exc)}; check this machine's "
                        "credentials for that cloud") from None
    return store


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def refresh(state: Any, store: Any, run_id: str) -> dict | None:
    """Rebuild the run's rows here from its bucket (newer than this machine's when another driver
    drove it). The controller process is this machine's own field: a pid recorded by another machine
    names nothing here, so the bucket's is never taken over (a run first seen here has none)."""
    from .journal import restore

    before = state.get_run(run_id)
    mine = before.get("controller_pid") if before else None
    found = restore(state, store, run_id)
    if found is not None and found.get("controller_pid") != mine:
        state.update_run(run_id, controller_pid=mine)
        found = state.get_run(run_id)
    return found


def refresh_reached(state: Any, run: dict) -> dict:
    """A run this machine does not drive, read again from its bucket, so that every `status` and
    `watch` shows what its driver wrote since: one reached by its bucket's URL (status --store), and
    any this machine has as unfinished (another machine may have driven it on, or ended it, since).
    The rows are replaced only by a newer record (journal.restore): this machine never writes back a
    stale view. Best effort: a bucket that cannot be read now leaves the rows as they are."""
    from .alive import controller_alive
    from .run_state import ACTIVE_RUN_STATES

    if controller_alive(run) or (remembered(run["id"]) is None and run["state"] not in ACTIVE_RUN_STATES):
        return run
    try:
        return refresh(state, store_of(run), run["id"]) or run
    except Exception:  # noqa: BLE001 - no network, no keys now: this machine's copy is shown
        return run
