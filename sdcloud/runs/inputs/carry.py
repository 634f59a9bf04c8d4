"""Trainer sources carried through the run's bucket by the control plane, for hosts whose network
takes them from the bucket only (network.trainer_sources = "bucket": Tencent's mainland regions).

At launch the bucket must hold the tree the host will look for, `cache/trainers/<name>.tar`
(sdcloud_agent/scripts.py: `kohya-<commit12>`, `diffusers-examples-v<version>`). If it does not,
the control plane uploads `$SDCLOUD_HOME/cache/trainers/<name>.tar` when that file exists, and
otherwise makes it here with git (this machine reaches GitHub, or the `trainer_sources` URL of the
run names a mirror), keeps it there for the next bucket, and uploads it. The archive is what a
host would have packed itself: one folder `<name>/` holding the tree and `.sdcloud-source`
("<url> <ref> <commit>").
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from sdcloud_agent import boot, scripts

from ... import config
from ...errors import UserError


def cache_dir() -> Path:
    return config.home() / "cache" / "trainers"


def _check(path: Path, name: str) -> None:
    """One UserError line unless `path` is a tar of one folder `name/` with its .sdcloud-source."""
    try:
        with tarfile.open(path) as tar:
            names = tar.getnames()
    except (OSError, tarfile.TarError) as exc:
        raise UserError(f"{path} is not a tar archive ({exc})") from None
    if f"{name}/.sdcloud-source" not in names or any(n != name and not n.startswith(name + "/") for n in names):
        raise UserError(f"{path} must hold one folder {name}/ with its .sdcloud-source (as sdcloud packs it)")


def carry_trainer_sources(store, agent: dict) -> str | None:
    """Make sure the run's bucket holds the trainer sources the host needs; what was done
    (None: the run needs none, "present", "uploaded")."""
    trainer, args = agent.get("trainer", "builtin"), agent.get("trainer_args")
    if not scripts.needed(trainer, args):
        return None
    version = scripts.lock_pins(boot.lock_text("cuda")).get("diffusers")  # the host's diffusers
    try:
        a = scripts.archive(trainer, agent.get("trainer_sources") or {}, version)
    except scripts.SourceError as exc:
        raise UserError(str(exc)) from None
    if store.head(a.key) is not None:
        return "present"
    local = cache_dir() / f"{a.name}.tar"
    if not local.exists():
        try:
            scripts.pack(a, local)
        except (scripts.SourceError, OSError) as exc:
            local.unlink(missing_ok=True)
            raise UserError(f"the run's hosts take trainer sources from the bucket, and {a.what} could not be "
                            f"fetched here ({exc}); put its archive at {local}") from None
    _check(local, a.name)
    part = a.key + ".part"  # whole or not at all, as the host writes its cache
    store.put_file(part, local)
    store.copy(part, a.key)
    store.delete(part)
    return "uploaded"
