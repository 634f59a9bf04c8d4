"""A run's finished model: where it is in the bucket, and downloading it (`sdcloud pull`)."""

from __future__ import annotations

from pathlib import Path

from ...errors import UserError


def _store_and_url(run: dict):
    from .run_spec import RunSpec
    from .state import StateStore
    from .store import open_run_store, store_config

    spec = RunSpec(**run["spec"])
    conf = store_config(spec.provider, spec.store, spec.region, StateStore().infra(spec.provider, spec.region or ""))
    return open_run_store(conf), conf["url"].rstrip("/")


def location(run: dict) -> str:
    """The artifacts' URL, e.g. s3://bucket/prefix/runs/<id>/artifacts/."""
    _, url = _store_and_url(run)
    return f"{url}/runs/{run['id']}/artifacts/"


def pull(run: dict, dest: Path) -> list[Path]:
    """Download every artifact of the run into dest (relative paths kept). Files already there
    with the same size are skipped, so a second pull only fetches what is missing."""
    from .store import StoreError

    store, _ = _store_and_url(run)
    prefix = f"runs/{run['id']}/artifacts/"
    try:
        infos = store.list(prefix)
    except StoreError as exc:
        raise UserError(f"cannot list the artifacts of run {run['id']}: {exc}") from None
    if not infos:
        raise UserError(f"run {run['id']} has no artifacts yet (state: {run['state']}); see: sdcloud status {run['id']}")
    out = []
    for info in infos:
        rel = info.key[len(prefix):]
        if not rel or rel.startswith("/") or ".." in Path(rel).parts:
            continue  # never write outside dest
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if not (target.is_file() and target.stat().st_size == info.size):
            store.get_file(info.key, target)
        out.append(target)
    return out
