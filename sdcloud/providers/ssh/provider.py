"""The SSH provider: GPU hosts the user owns, listed in $SDCLOUD_HOME/ssh-hosts.toml.

Each "instance" is one `python -m sdcloud_agent run` process on a host, started over SSH
(paramiko, key auth) from the agent wheel (the one cloud hosts fetch from the bucket). Everything sdcloud keeps on a
host lives under `<workdir>/<token>/`: the agent wheel, cfg.json (0600), agent.log and instance.json
(pid, process start time, the three sdcloud tags), so that adoption after a controller crash,
`sdcloud down` and the stray sweep work as on a cloud. One run per host at a time.

All host-side work is done by a small Python helper (host_helper.py) run with the host's
interpreter: one SSH exec per operation, JSON in on stdin, JSON out on stdout, no shell quoting
of payloads, and a file lock so that two controllers cannot start two agents on one host.

Host keys: trust on first use, recorded in $SDCLOUD_HOME/ssh_known_hosts (the user's
~/.ssh/known_hosts is consulted too, read-only); a changed key stops with a UserError.
"""

from __future__ import annotations

import base64
import logging
import os
from datetime import datetime, timezone
from pathlib import Path

from ... import clock
from ...offers.catalog import CatalogRow
from ...errors import UserError
from ...events import Kind
from ...offers.optimizer import Offer
from .credentials import StoreCredentials
from ..base import (PENDING, RUNNING, TAG_RUN, TAG_TOKEN, TERMINATED, CapacityError, EventSink, Instance, LaunchSpec,
                   ProviderError, no_events)
# The hosts file and the connections were this module's before the split: the names stay importable here.
from .connection import (  # noqa: F401
    CONNECT_TIMEOUT, PASSPHRASE_ENV, HostUnreachable, SshConnections, _helper_command, _helper_source,
)
from .hosts import SshHost, hosts_path, load_hosts  # noqa: F401
from ..traits import name_of

NAME = name_of(__name__)  # "ssh", or the name a copy of this folder is registered under

log = logging.getLogger(__name__)

TERMINATE_GRACE_SECONDS = 60.0
# How long a freshly started agent must stay up before launch() reports it: an agent that dies at
# once (wrong interpreter, missing boto3) is a setup problem to show the user, not a lost host.
START_CHECK_SECONDS = 1.5


def agent_zip() -> bytes:
    """The agent wheel cloud hosts get (a wheel is a zip that `PYTHONPATH=agent.whl` can import)."""
    from sdcloud_agent.wheel import current

    return current().data


class SshProvider(SshConnections):
    name = NAME

    def __init__(self, hosts_file: str | os.PathLike | None = None, agent_argv: list[str] | None = None,
                 known_hosts: str | os.PathLike | None = None, **_: object):
        super().__init__(hosts_file, known_hosts)
        # Test hook: argv after the host's python instead of `-m sdcloud_agent run --config cfg.json`.
        self.agent_argv = agent_argv
        self._zip: str | None = None
        self._wheel_name = "agent.whl"
        self._seen: dict[str, Instance] = {}  # last known instance per id, for hosts that stop answering
        # Short-lived store keys per run, held in memory only; which issue each instance holds.
        self._store_keys: dict[str, StoreCredentials] = {}
        self._keys_sent: dict[str, float] = {}
        self.last_errors: list[str] = []

    # instances
    def _instance(self, h: SshHost, rec: dict) -> Instance:
        inst = Instance(provider=NAME, id=f"{h.name}:{rec['pid']}", region="ssh", zone=h.name, instance_type=h.name,
                        market=rec.get("market", "on-demand"), state=RUNNING if rec.get("alive") else TERMINATED,
                        price_per_hour=rec.get("price_per_hour", h.price_per_hour), public_ip=h.host,
                        launched_at=datetime.fromtimestamp(rec["created"], timezone.utc) if rec.get("created") else None,
                        tags=dict(rec.get("tags") or {}))
        self._seen[inst.id] = inst
        return inst

    @staticmethod
    def _split_id(instance_id: str) -> tuple[str, int]:
        name, _, pid = instance_id.rpartition(":")
        if not name or not pid.isdigit():
            raise ProviderError(f"not an ssh instance id: {instance_id!r} (expected HOST:PID)")
        return name, int(pid)

    def _group(self, ids: list[str]) -> dict[str, set[int]]:
        by_host: dict[str, set[int]] = {}
        for i in ids:
            name, pid = self._split_id(i)
            by_host.setdefault(name, set()).add(pid)
        return by_host

    # offers
    def offers(self, tier=None, market: str | None = None, regions: list[str] | None = None) -> list[Offer]:
        if isinstance(tier, str):
            from ...offers.tiers import get_tier

            tier = get_tier(tier)
        need = tier.min_vram_gb if tier is not None else 0.0
        fit = [h for h in self.hosts if h.vram_gb >= need]
        if not fit:
            have = ", ".join(f"{h.name} {h.vram_gb:g} GB" for h in self.hosts)
            raise UserError(f"no ssh host has the {need:g} GB of GPU memory tier {tier.name} needs ({have}); "
                            f"see {self.hosts_file}")
        today = clock.utc_now().date().isoformat()
        return [Offer(CatalogRow(provider=NAME, region="ssh", zone=h.name, instance_type=h.name, gpu=h.gpu,
                                 gpu_count=h.gpu_count, vram_gb=h.vram_gb, vcpus=0, memory_gb=0.0, nvme_gb=0.0,
                                 ondemand_price=h.price_per_hour, spot_price=h.price_per_hour, currency="USD",
                                 interruption_band=None, snapshot_date=today, ondemand_estimate=False,
                                 spot_estimate=False, source=str(self.hosts_file)), market or "on-demand")
                for h in fit]

    # Provider protocol
    def launch(self, offer: Offer, spec: LaunchSpec, market: str, max_price: float | None = None,
               events: EventSink = no_events) -> Instance:
        """Adopt the live agent with this token on any host, else start one on the offer's host, or
        on the next free host that fits (cheapest first) when that one is busy or down."""
        self.events = events
        need = float(spec.agent_config.get("min_vram_gb") or 0.0)
        fit = [h for h in self.hosts if h.vram_gb >= need]
        if max_price is not None:
            fit = [h for h in fit if h.price_per_hour <= max_price]
            if not fit:
                raise UserError(f"every ssh host that fits costs more than --max-price ${max_price:g}/h")
        fit.sort(key=lambda h: (h.name != offer.row.zone, h.price_per_hour))
        reachable: list[SshHost] = []
        why: list[str] = []
        for h in fit:  # adoption first, everywhere: an earlier launch may have gone to a fallback host
            try:
                recs = self._call(h, {"op": "scan"})["records"]
            except HostUnreachable as exc:
                events(Kind.HOST_UNREACHABLE, {"host": h.name, "error": str(exc)})
                why.append(f"{h.name} unreachable ({exc.reason})")
                continue
            reachable.append(h)
            for rec in recs:
                if rec["alive"] and rec.get("token") == spec.token:
                    events(Kind.ADOPTED, {"instance": f"{h.name}:{rec['pid']}", "token": spec.token})
                    inst = self._instance(h, rec)
                    inst.adopted = True
                    return inst
        if self._zip is None:
            from sdcloud_agent.wheel import current

            self._zip, self._wheel_name = base64.b64encode(agent_zip()).decode(), current().filename
        keys = self._keys_for(spec.run_id, spec.agent_config.get("store") or {})
        for h in reachable:
            payload = {"op": "start", "token": spec.token, "tags": spec.tags, "config": dict(spec.agent_config),
                       "zip": self._zip, "wheel_name": self._wheel_name, "argv": self.agent_argv, "market": market,
                       "price_per_hour": h.price_per_hour, "check_seconds": START_CHECK_SECONDS}
            if keys is not None:
                payload["credentials"] = keys.current()
            try:
                res = self._call(h, payload)
            except HostUnreachable as exc:
                events(Kind.HOST_UNREACHABLE, {"host": h.name, "error": str(exc)})
                why.append(f"{h.name} unreachable ({exc.reason})")
                continue
            if "busy" in res:
                other = res["busy"].get("tags", {}).get(TAG_RUN, "?")
                events(Kind.HOST_BUSY, {"host": h.name, "run": other})
                why.append(f"{h.name} busy with run {other}")
                continue
            if "exited" in res:
                last = [line for line in res["log"].splitlines() if line.strip()][-1:] or ["(no output)"]
                raise UserError(f"ssh host {h.name}: the agent exited at once (code {res['exited']}): {last[0][-300:]}; "
                                f"see {res['dir']}/agent.log there")
            rec = res.get("started") or res.get("adopted")
            inst = self._instance(h, rec)
            if "adopted" in res:
                events(Kind.ADOPTED, {"instance": inst.id, "token": spec.token})
                inst.adopted = True
            else:
                events(Kind.LAUNCHED, {"instance": inst.id, "host": h.name, "pid": rec["pid"]})
            if keys is not None:
                self._keys_sent[inst.id] = keys.issued
                events(Kind.STORE_CREDENTIALS, {"instance": inst.id, "expires": keys.expiry()})
            return inst
        raise CapacityError("no free ssh host: " + ("; ".join(why) or "none fits"))

    def _keys_for(self, run_id: str, store_conf: dict) -> StoreCredentials | None:
        if not StoreCredentials.needed(store_conf):
            return None
        if run_id not in self._store_keys:
            self._store_keys[run_id] = StoreCredentials(store_conf, run_id)
        return self._store_keys[run_id]

    def renew_credentials(self, instance_id: str, run_id: str, store_conf: dict, events: EventSink = no_events) -> bool:
        """Hand the host fresh store keys when its current ones are past half their life. True if renewed."""
        keys = self._keys_for(run_id, store_conf)
        if keys is None:
            return False
        if not keys.due() and self._keys_sent.get(instance_id) == keys.issued:
            return False
        fresh = keys.current()
        name, pid = self._split_id(instance_id)
        h = self.host(name)
        if h is None:
            return False
        try:
            res = self._call(h, {"op": "credentials", "pid": pid, "credentials": fresh})
        except HostUnreachable as exc:
            events(Kind.STORE_CREDENTIALS_FAILED, {"instance": instance_id, "error": str(exc)})
            return False
        if "renewed" not in res:
            return False
        self._keys_sent[instance_id] = keys.issued
        events(Kind.STORE_CREDENTIALS_RENEWED, {"instance": instance_id, "expires": keys.expiry()})
        return True

    def describe(self, ids: list[str], region: str | None = None) -> list[Instance]:
        out = []
        for name, pids in self._group(ids).items():
            h = self.host(name)
            if h is None:
                continue  # removed from the hosts file: nothing we can reach
            try:
                recs = self._call(h, {"op": "scan"})["records"]
            except HostUnreachable as exc:
                # Unknown is not gone: the heartbeat timeout decides whether the host is lost.
                log.warning("%s", exc)
                for pid in pids:
                    seen = self._seen.get(f"{name}:{pid}")
                    if seen is None or seen.live:
                        out.append(seen or Instance(provider=NAME, id=f"{name}:{pid}", region="ssh", zone=name,
                                                    instance_type=name, market="on-demand", state=PENDING,
                                                    public_ip=h.host))
                continue
            out += [self._instance(h, r) for r in recs if r["pid"] in pids]
        return out

    def terminate(self, ids: list[str], region: str | None = None) -> None:
        """SIGTERM the agent's process group (it saves and uploads), SIGKILL after the grace period."""
        errors = []
        for name, pids in self._group(ids).items():
            h = self.host(name)
            if h is None:
                errors.append(f"{name}: not in {self.hosts_file}")
                continue
            try:
                self._call(h, {"op": "terminate", "pids": sorted(pids), "grace": TERMINATE_GRACE_SECONDS},
                           timeout=TERMINATE_GRACE_SECONDS + 60)
            except HostUnreachable as exc:
                errors.append(str(exc))
                continue
            for pid in pids:
                self._seen.pop(f"{name}:{pid}", None)
        if errors:
            raise ProviderError("terminate: " + "; ".join(errors))

    def find_tagged(self, run_id: str | None = None, regions: list[str] | None = None) -> list[Instance]:
        out: list[Instance] = []
        self.last_errors = []
        for h in self.hosts:
            try:
                recs = self._call(h, {"op": "scan"})["records"]
            except HostUnreachable as exc:
                self.last_errors.append(str(exc))
                continue
            for rec in recs:
                tags = rec.get("tags") or {}
                if rec["alive"] and TAG_TOKEN in tags and (run_id is None or tags.get(TAG_RUN) == run_id):
                    out.append(self._instance(h, rec))
        return out

    def price_history(self, instance_type: str, zone: str, start: datetime, end: datetime) -> list[tuple[datetime, float]]:
        h = self.host(zone) or self.host(instance_type)
        price = h.price_per_hour if h else 0.0
        return [(start, price), (end, price)]

    # extras: `sdcloud ssh` and log tailing
    def ssh_argv(self, instance: Instance | str) -> list[str]:
        """The `ssh` command line that opens a shell on the instance's host, with the same host keys."""
        instance_id = instance if isinstance(instance, str) else instance.id
        name, _ = self._split_id(instance_id)
        h = self.host(name)
        if h is None:
            raise UserError(f"ssh host {name} is no longer in {self.hosts_file}")
        known = f"{self.known_hosts} {Path('~/.ssh/known_hosts').expanduser()}"
        return ["ssh", "-i", h.key, "-p", str(h.port), "-o", f"UserKnownHostsFile={known}", f"{h.user}@{h.host}"]

    def tail_log(self, instance_id: str, offset: int = 0, limit: int = 1 << 20) -> tuple[str, int]:
        """The agent's log on the host from byte `offset`: (text, the offset to ask for next)."""
        name, pid = self._split_id(instance_id)
        h = self.host(name)
        if h is None:
            raise UserError(f"ssh host {name} is no longer in {self.hosts_file}")
        recs = self._call(h, {"op": "scan"})["records"]
        rec = next((r for r in recs if r["pid"] == pid), None)
        if rec is None:
            return "", offset
        res = self._call(h, {"op": "tail", "token": rec["token"], "offset": int(offset), "limit": int(limit)})
        return res["text"], res["offset"]

    def close(self) -> None:
        for name in list(self._clients):
            client = self._clients.pop(name)
            client.close()


PROVIDER_CLASS = SshProvider
