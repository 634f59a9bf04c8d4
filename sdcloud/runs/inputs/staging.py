"""Everything a run needs from the user's machine, put in its bucket before anyone else may drive it.

When a driver first takes up a run here (`up`, `resume`, `up --unattended`'s hand-over), before the
run's journal says it is live:

- a local dataset folder is uploaded to `runs/<id>/dataset/` (datasets.upload_dataset);
- a local model file or folder is put in the bucket's model cache (models.upload_model);
- the trainer sources that the run's hosts take from the bucket (the mainland profile) are carried
  (carry.carry_trainer_sources);
- the config.toml sections the run reads (`RUN_SECTIONS` and its provider's own) are recorded, with
  the settings they give its hosts (network profile and mirrors, self-end grace).

One `inputs-staged` event holds the bucket references and the settings; the journal carries it to
the bucket. A driver elsewhere (the cloud function with an empty home, a second machine) launches
from that record and never reads a path of the user's machine; while it acts for the run the
recorded sections stand in for its own config.toml (config.run_settings). A resume on the machine
that staged the run stages it again (new images, changed settings); a resume elsewhere keeps the record.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Callable, Protocol

from ... import config
from ...errors import UserError
from ...events import Kind
from ...providers.traits import Hosts, names, traits
from ..records.run_spec import RunPlan, RunSpec
from ..records.state import StateStore


class StagingOwner(Protocol):
    """What staging reads of the run's driver (runs/driving/controller.py) to put its inputs in its bucket."""

    spec: RunSpec
    plan: RunPlan
    run_id: str
    state: StateStore
    store: Any
    store_conf: dict
    total_steps: int
    event: Callable[..., None]

    @property
    def infra(self) -> dict: ...

# The config.toml tables a run's driving reads, besides its provider's own (traits.config_sections).
RUN_SECTIONS = ("network", "hosts", "currency", "catalog")


def this_machine() -> str:
    """Who staged a record: this machine and its sdcloud home (two homes on one machine are two users)."""
    return f"{socket.gethostname()}:{config.home().resolve()}"


def sections(provider: str) -> tuple[str, ...]:
    own = traits(provider).config_sections if provider in names() else ()
    return RUN_SECTIONS + tuple(s for s in own if s not in RUN_SECTIONS)


def recorded(state: StateStore, run_id: str) -> tuple[dict | None, bool]:
    """(the latest record, whether the user resumed the run after it was made)."""
    last, resumed_after = None, False
    for e in state.events(run_id):
        kind = e["kind"]
        if kind is Kind.INPUTS_STAGED:
            last, resumed_after = e["data"], False
        elif kind is Kind.RESUME and last is not None:
            resumed_after = True
    return last, resumed_after


def recorded_settings(state: StateStore, run_id: str) -> dict | None:
    """The config.toml sections the run recorded (None: no record yet; this machine's stand)."""
    rec, _ = recorded(state, run_id)
    return rec.get("settings") if rec else None


def needs_staging(state: StateStore, run_id: str) -> bool:
    rec, resumed_after = recorded(state, run_id)
    return rec is None or (resumed_after and rec.get("staged_on") == this_machine())


def _without_secrets(obj: Any) -> Any:
    """The settings as recorded: a key or value that looks like a credential is left out (the journal
    is read by every machine that reaches the bucket; credentials come from each driver's own role)."""
    from sdcloud_agent.config import SECRET_VALUE_PREFIXES, SECRET_WORDS

    if isinstance(obj, dict):
        return {k: _without_secrets(v) for k, v in obj.items()
                if not any(w in str(k).lower() for w in SECRET_WORDS)
                and not (isinstance(v, str) and v.startswith(SECRET_VALUE_PREFIXES))}
    if isinstance(obj, list):
        return [_without_secrets(v) for v in obj]
    return obj


def _local_path(value: str | None) -> Path | None:
    """A path of the user's machine (up made it absolute), not a URL, a cache reference or a hub id."""
    if not value or "://" in value or value.startswith("cache:"):
        return None
    p = Path(value).expanduser()
    return p if p.is_absolute() else None


def _from_record(rec: dict | None, key: str, value: str, what: str, run_id: str) -> str:
    """A path that is not here: its bucket reference from an earlier record, or one line."""
    earlier = (rec or {}).get(key)
    if earlier and earlier != value:
        return earlier
    raise UserError(f"run {run_id}'s {what} {value} is not on this machine and not in its bucket; "
                    f"resume it on the machine that has it: sdcloud resume {run_id}")


def stage(ctl: StagingOwner, drive: str | None = None) -> dict:
    """Put the run's inputs in its bucket and record them with its settings; the record."""
    with config.run_settings(None):  # this machine's own config.toml, not a run's recorded one
        return _stage(ctl, drive)


def _stage(ctl: StagingOwner, drive: str | None) -> dict:
    from .agent_config import agent_config, self_end_grace
    from .datasets import upload_dataset
    from .models import is_local_model, upload_model
    from .network import host_network, profile

    spec, run_id = ctl.spec, ctl.run_id
    rec, _ = recorded(ctl.state, run_id)
    in_place = traits(spec.provider).hosts is Hosts.THIS_MACHINE  # its host reads this machine's paths
    dataset = spec.dataset
    path = _local_path(dataset)
    if path is not None and not in_place:
        if path.exists():
            dataset = upload_dataset(ctl.store, ctl.store_conf["url"], run_id, str(path), ctl.event)
        else:
            dataset = _from_record(rec, "dataset", str(path), "dataset", run_id)
    model = spec.model
    path = _local_path(model)
    if path is not None and not in_place:
        if is_local_model(model, spec.provider):
            model = upload_model(ctl.store, str(path), ctl.event)
        elif not path.exists():
            model = _from_record(rec, "model", str(path), "model", run_id)
    from sdcloud_agent.trainers.models import looks_like_hub_id

    if model and looks_like_hub_id(model):
        from .hub_access import put_for_host

        put_for_host(ctl.store, run_id)  # a gated model's token, for the host's fetch only (never recorded)
    from .samples import put_wandb_key

    put_wandb_key(ctl.store, run_id, spec)  # --report-to wandb: the key, for the trainer's environment only
    settings = _without_secrets({s: config.settings().get(s) or {} for s in sections(spec.provider)})
    region = (ctl.infra or {}).get("region") or ctl.store_conf.get("region")
    net = host_network(region, spec.provider, spec.network)
    carried = None
    if traits(spec.provider).is_cloud and net.get("trainer_sources") == "bucket":
        from .carry import carry_trainer_sources

        # Here, where GitHub (or the user's mirror) is reachable; the host and the driver find it in the bucket.
        agent = agent_config(ctl.plan, run_id, 1, ctl.total_steps, ctl.store_conf)
        agent["network"] = net
        carried = carry_trainer_sources(ctl.store, agent)
    data = {"dataset": dataset, "model": model, "settings": settings,
            "effective": {"network_profile": profile(spec.provider, region)[0], "network": net,
                          "self_end_grace_s": self_end_grace(spec), "region": region},
            "staged_on": this_machine(), "trainer_sources": carried, "store": ctl.store_conf.get("url"),
            "drive": drive or (rec or {}).get("drive")}
    ctl.event(Kind.INPUTS_STAGED, data)
    return data
