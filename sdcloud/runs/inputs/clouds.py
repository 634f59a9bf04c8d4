"""A run that may use more than one cloud: `--provider aws,tencent` (or `[defaults] providers`).

The first provider named is the run's home: its store keeps the journal, the driver lease and the
stop requests, and its first attempt launches there. The others are where the run may move when
the home cloud's spot runs dry or turns dear (the spot policy decides; runs/driving/placement.py).
Everything a run across clouds needs is checked here before anything is recorded: each name known and a cloud with a price
catalog, credentials for every one of them, and no `--unattended` (see docs/runs.md, "Runs across
clouds": no host or cloud function holds the other cloud's keys, so nothing unattended could drive
the move).
"""

from __future__ import annotations

from ...errors import UserError
from ...names import match_name
from ...providers.traits import names, traits


def split(value: object, flag: str = "--provider") -> list[str]:
    """Provider names from `aws,tencent`, a run file's list, or one name; spaces around a name dropped.

    An empty item (`aws,`, `,aws`, `["aws", ""]`) or a name given twice is refused, not dropped: it is
    a typo as often as not (`aws,,tencent`), and the list decides where the run may go."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    out: list[str] = []
    for item in items:
        name = str(item).strip()
        if not name:
            raise UserError(f"{flag} {_shown(value)} has an empty provider name; list them as aws,tencent")
        if name.lower() in (o.lower() for o in out):
            raise UserError(f"{flag} {_shown(value)} names {name} twice; name each provider once")
        out.append(name)
    return out


def _shown(value: object) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def named_here(key: str, fields: dict, in_file: set) -> bool:
    """Whether [defaults] `key` is `providers` while the flags or the run file name a provider (they win)."""
    return key == "providers" and (fields.get("provider") is not None or "provider" in in_file)


def resolve(value: object, shared: str = "a run", flag: str = "--provider") -> list[str]:
    """The providers of a run (or batch job: `shared`), each matched to a known name; more than one must
    all be clouds with a catalog (a move copies the checkpoint, a job's relay its images, between two
    clouds' stores)."""
    found = [match_name(p, names(), "provider") for p in split(value, flag)]
    if len(set(found)) != len(found):
        raise UserError(f"{flag} {_shown(value)} names a provider twice; name each provider once")
    if len(found) > 1:
        for name in found:
            t = traits(name)
            if not (t.is_cloud and t.catalog):
                raise UserError(f"--provider {','.join(found)}: {name} cannot share {shared} with another cloud "
                                "(only clouds with a price catalog can)")
    return found


def check_credentials(providers: list[str]) -> None:
    """Every named provider's credentials, before the run is recorded: one line naming the first missing."""
    from ...providers import get_provider
    from ...providers.capabilities import ChecksCredentials

    for name in providers:
        try:  # a provider whose client needs keys to exist (its session) refuses when made
            prov = get_provider(name)
            if isinstance(prov, ChecksCredentials):
                prov.check_credentials()
        except UserError as exc:
            if len(providers) == 1:
                raise
            raise type(exc)(f"provider {name} (of {','.join(providers)}): {exc}") from None


def ensure_other_stacks(state, providers: list[str], ensure_infra, on_output) -> None:
    """The stack (bucket, network, role) of every cloud the run may move to, made now by `ensure_infra`
    as the home cloud's is: a move copies the checkpoint into that cloud's bucket before its first host starts."""
    from ...providers.traits import default_region

    for other in providers[1:]:
        if traits(other).stack is not None and not (state.infra(other, "") or state.infra(other, default_region(other))):
            region = default_region(other)
            state.save_infra(other, region, ensure_infra(other, region, on_output=on_output))


def refuse_unattended(providers: list[str] | None) -> None:
    """A run across clouds is driven from this machine: the cloud driver of one cloud holds no keys to
    launch in, or copy a checkpoint into, the other (docs/runs.md)."""
    if providers and len(providers) > 1:
        raise UserError(f"--unattended runs in one cloud: a run across {','.join(providers)} is driven from this "
                        "machine (or --detach), because no cloud driver holds the other cloud's keys")


__all__ = ["split", "named_here", "resolve", "check_credentials", "ensure_other_stacks", "refuse_unattended"]
