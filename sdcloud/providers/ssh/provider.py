"""The SSH provider: GPU hosts the user owns, listed in $SDCLOUD_HOME/ssh-hosts.toml.

Each "instance" is one `python -m sdcloud_agent run` process on a host, started over SSH
(paramiko, key auth) from the agent wheel (the one cloud hosts fetch from the bucket). Everything sdcloud keeps on a
host lives under `<workdir>/<token>/`: the agent wheel, cfg.json (0600), agent.log and instance.json
(pid, process start time, the three sdcloud tags), so that adoption after a controller crash,
`sdcloud down` and the stray sweep work as on a cloud. One run per host at a time.

All host-side work is done by a small Python helper (HELPER below) run with the host's
interpreter: one SSH exec per operation, JSON in on stdin, JSON out on stdout, no shell quoting
of payloads, and a file lock so that two controllers cannot start two agents on one host.

Host keys: trust on first use, recorded in $SDCLOUD_HOME/ssh_known_hosts (the user's
~/.ssh/known_hosts is consulted too, read-only); a changed key stops with a UserError.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import tomllib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ... import clock, config
from ...offers.catalog import CatalogRow
from ...errors import UserError
from ...offers.optimizer import Offer
from .credentials import StoreCredentials
from ..base import (PENDING, RUNNING, TAG_RUN, TAG_TOKEN, TERMINATED, CapacityError, CredentialsError, EventSink,
                   Instance, LaunchSpec, ProviderError, no_events)

log = logging.getLogger(__name__)

TERMINATE_GRACE_SECONDS = 60.0
CONNECT_TIMEOUT = 15.0
# How long a freshly started agent must stay up before launch() reports it: an agent that dies at
# once (wrong interpreter, missing boto3) is a setup problem to show the user, not a lost host.
START_CHECK_SECONDS = 1.5
PASSPHRASE_ENV = "SDCLOUD_SSH_KEY_PASSPHRASE"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class SshHost:
    name: str
    host: str
    user: str
    key: str  # path to the private key; the key itself is only ever read by paramiko
    gpu: str
    vram_gb: float
    gpu_count: int = 1
    port: int = 22
    price_per_hour: float = 0.0
    python: str = "python3"  # a shell word (or words) on the host
    workdir: str = "~/.sdcloud-agent"


def hosts_path(path: str | os.PathLike | None = None) -> Path:
    chosen = path or os.environ.get("SDCLOUD_SSH_HOSTS") or config.home() / "ssh-hosts.toml"
    return Path(chosen).expanduser()


def load_hosts(path: Path) -> list[SshHost]:
    """Parse and check the hosts file; any problem is one UserError line naming the file and field."""
    if not path.exists():
        raise UserError(f"no ssh hosts file at {path}: list your GPU hosts there as [[hosts]] tables "
                        f"(name, host, user, key, gpu, vram_gb; see docs/providers-ssh.md)")
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"{path}: not valid TOML ({exc})") from None
    raw_hosts = data.get("hosts")
    if not isinstance(raw_hosts, list) or not raw_hosts:
        raise UserError(f"{path}: no [[hosts]] tables; each needs name, host, user, key, gpu, vram_gb")
    hosts: list[SshHost] = []
    for i, raw in enumerate(raw_hosts, 1):
        where = f"{path}: host #{i}" + (f" ({raw.get('name')})" if isinstance(raw, dict) and raw.get("name") else "")
        if not isinstance(raw, dict):
            raise UserError(f"{where}: must be a table")
        for field in ("name", "host", "user", "key", "gpu", "vram_gb"):
            if raw.get(field) in (None, ""):
                raise UserError(f"{where} is missing '{field}'")
        unknown = set(raw) - set(SshHost.__dataclass_fields__)
        if unknown:
            raise UserError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        name = str(raw["name"])
        if not _NAME_RE.match(name):
            raise UserError(f"{where}: 'name' may hold letters, digits, '.', '_' and '-' only")
        if any(h.name == name for h in hosts):
            raise UserError(f"{where}: 'name' {name!r} is used twice")
        for field in ("host", "user", "key", "gpu", "python", "workdir"):
            if field in raw and not isinstance(raw[field], str):
                raise UserError(f"{where}: '{field}' must be a string")
        try:
            port, gpu_count = int(raw.get("port", 22)), int(raw.get("gpu_count", 1))
            vram, price = float(raw["vram_gb"]), float(raw.get("price_per_hour", 0.0))
        except (TypeError, ValueError) as exc:
            raise UserError(f"{where}: port, gpu_count, vram_gb and price_per_hour must be numbers ({exc})") from None
        if not 0 < port < 65536:
            raise UserError(f"{where}: 'port' must be 1-65535, got {port}")
        if gpu_count < 1 or vram <= 0 or price < 0:
            raise UserError(f"{where}: gpu_count and vram_gb must be positive and price_per_hour 0 or more")
        key = Path(raw["key"]).expanduser()
        if not key.is_absolute():
            key = path.parent / key  # relative to the hosts file, not to wherever sdcloud runs
        hosts.append(SshHost(name=name, host=raw["host"], user=raw["user"], key=str(key), gpu=raw["gpu"], vram_gb=vram,
                             gpu_count=gpu_count, port=port, price_per_hour=price, python=raw.get("python", "python3"),
                             workdir=raw.get("workdir", "~/.sdcloud-agent")))
    return hosts


def agent_zip() -> bytes:
    """The agent wheel cloud hosts get (a wheel is a zip that `PYTHONPATH=agent.whl` can import)."""
    from sdcloud_agent.wheel import current

    return current().data


# The host-side helper. Runs under the host's own Python (3.6+; Linux /proc), so no f-strings
# with `=`, no walrus, no type hints, and nothing from sdcloud.
HELPER = r'''
import base64, fcntl, json, os, signal, subprocess, sys, time

def stat(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError, ValueError):
        return None
    return rest  # rest[0] state, rest[1] ppid, rest[19] start time

def alive(pid, start=None):
    st = stat(pid)
    if st is None or st[0] in ("Z", "X") or (start and st[19] != start):
        return False
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return b"sdcloud_agent" in f.read()
    except OSError:
        return False

def table():
    out = {}
    for e in os.listdir("/proc"):
        if e.isdigit():
            st = stat(int(e))
            if st is not None and st[0] not in ("Z", "X"):
                out[int(e)] = (int(st[1]), st[19])
    return out

def descendants(pid, procs):
    found, todo = {}, [pid]
    while todo:
        p = todo.pop()
        for c, (ppid, start) in procs.items():
            if ppid == p and c not in found:
                found[c] = start
                todo.append(c)
    return found

def records(wd):
    out = []
    if not os.path.isdir(wd):
        return out
    for tok in sorted(os.listdir(wd)):
        p = os.path.join(wd, tok, "instance.json")
        try:
            with open(p) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        rec["alive"] = not rec.get("ended") and alive(rec["pid"], rec.get("start"))
        out.append(rec)
    return out

def write_json(path, obj, mode=0o600):
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)

def main():
    req = json.loads(sys.stdin.read())
    wd = os.path.abspath(os.path.expanduser(req["workdir"]))
    op = req["op"]
    if op == "scan":
        return {"workdir": wd, "records": records(wd)}
    if op == "tail":
        path = os.path.join(wd, req["token"], "agent.log")
        try:
            with open(path, "rb") as f:
                f.seek(req["offset"])
                data = f.read(req["limit"])
        except OSError:
            data = b""
        return {"text": data.decode("utf-8", "replace"), "offset": req["offset"] + len(data)}
    if op == "start":
        os.makedirs(wd, 0o700, exist_ok=True)
        lock = open(os.path.join(wd, ".lock"), "a")
        fcntl.flock(lock, fcntl.LOCK_EX)  # one start at a time on this host
        for rec in records(wd):
            if rec["alive"]:
                return {"adopted": rec} if rec["token"] == req["token"] else {"busy": rec}
        tdir = os.path.join(wd, req["token"])
        os.makedirs(tdir, 0o700, exist_ok=True)
        zpath = os.path.join(tdir, req.get("wheel_name") or "agent.zip")
        with open(zpath + ".tmp", "wb") as f:
            f.write(base64.b64decode(req["zip"]))
        os.replace(zpath + ".tmp", zpath)
        cfg = req["config"]
        cfg.setdefault("workdir", os.path.join(tdir, "work"))
        if req.get("credentials"):
            # Short-lived keys for the store: a 0600 file the agent re-reads, never its config or argv.
            cpath = os.path.join(tdir, "store-credentials.json")
            write_json(cpath, req["credentials"])
            cfg["store"] = dict(cfg["store"], credentials="file:" + cpath)
        write_json(os.path.join(tdir, "cfg.json"), cfg)
        env = dict(os.environ)
        env["PYTHONPATH"] = zpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        argv = [sys.executable] + (req.get("argv") or ["-m", "sdcloud_agent", "run", "--config", "cfg.json"])
        logf = open(os.path.join(tdir, "agent.log"), "ab")
        # Its own session (setsid): survives the SSH channel, and terminate can signal its group.
        proc = subprocess.Popen(argv, cwd=tdir, env=env, stdin=subprocess.DEVNULL, stdout=logf,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        st = stat(proc.pid)
        rec = {"token": req["token"], "pid": proc.pid, "start": st[19] if st else None, "tags": req["tags"],
               "market": req["market"], "price_per_hour": req["price_per_hour"], "created": time.time(),
               "dir": tdir}
        write_json(os.path.join(tdir, "instance.json"), rec)
        time.sleep(req["check_seconds"])
        code = proc.poll()
        if code is not None:
            rec["ended"] = time.time()
            write_json(os.path.join(tdir, "instance.json"), rec)
            with open(os.path.join(tdir, "agent.log"), "rb") as f:
                f.seek(max(0, os.path.getsize(f.name) - 2000))
                tail = f.read().decode("utf-8", "replace")
            return {"exited": code, "log": tail, "dir": tdir}
        rec["alive"] = True
        return {"started": rec}
    if op == "credentials":
        for r in records(wd):
            if r["pid"] == req["pid"] and r["alive"]:
                write_json(os.path.join(wd, r["token"], "store-credentials.json"), req["credentials"])
                return {"renewed": r["pid"]}
        return {"gone": req["pid"]}
    if op == "terminate":
        want = set(req["pids"])
        recs = [r for r in records(wd) if r["pid"] in want and r["alive"]]
        procs = table()
        kids = {}
        for r in recs:
            kids.update(descendants(r["pid"], procs))
            try:
                os.killpg(r["pid"], signal.SIGTERM)  # the agent saves a checkpoint on SIGTERM
            except OSError:
                pass
        deadline = time.time() + req["grace"]
        while time.time() < deadline and any(alive(r["pid"], r.get("start")) for r in recs):
            procs = table()
            for r in recs:
                kids.update(descendants(r["pid"], procs))
            time.sleep(0.2)
        killed = []
        for r in recs:
            if alive(r["pid"], r.get("start")):
                killed.append(r["pid"])
                try:
                    os.killpg(r["pid"], signal.SIGKILL)
                except OSError:
                    pass
        # The trainer runs in a session of its own: kill what the agent left behind.
        procs = table()
        for pid, start in kids.items():
            if pid in procs and procs[pid][1] == start:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        for r in records(wd):
            if r["pid"] in want and not r.get("ended"):
                r.pop("alive", None)
                r["ended"] = time.time()
                write_json(os.path.join(wd, r["token"], "instance.json"), r)
            if r["pid"] in want:
                try:  # the keys die with the attempt
                    os.unlink(os.path.join(wd, r["token"], "store-credentials.json"))
                except OSError:
                    pass
        return {"terminated": [r["pid"] for r in recs], "killed": killed}
    raise SystemExit("unknown op " + op)

sys.stdout.write(json.dumps(main()))
'''


def _helper_command(python: str) -> str:
    # Base64 keeps the command free of newlines and quotes whatever the login shell is.
    code = base64.b64encode(HELPER.encode()).decode()
    return f"{python} -c 'import base64;exec(base64.b64decode(\"{code}\"))'"


class HostUnreachable(ProviderError):
    """The host did not answer over SSH (down, network, sshd stopped)."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message  # the short cause, for a list of hosts tried


class _ChannelBroke(Exception):
    """An operation's SSH channel broke after the connection was made (retried once)."""


def _fingerprint(key) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


class SshProvider:
    name = "ssh"

    def __init__(self, hosts_file: str | os.PathLike | None = None, agent_argv: list[str] | None = None,
                 known_hosts: str | os.PathLike | None = None, **_: object):
        self.hosts_file = hosts_path(hosts_file)
        self.known_hosts = Path(known_hosts) if known_hosts else config.home() / "ssh_known_hosts"
        # Test hook: argv after the host's python instead of `-m sdcloud_agent run --config cfg.json`.
        self.agent_argv = agent_argv
        self._hosts: list[SshHost] | None = None
        self._clients: dict[str, object] = {}
        self._zip: str | None = None
        self._wheel_name = "agent.whl"
        self._seen: dict[str, Instance] = {}  # last known instance per id, for hosts that stop answering
        # Short-lived store keys per run, held in memory only; which issue each instance holds.
        self._store_keys: dict[str, StoreCredentials] = {}
        self._keys_sent: dict[str, float] = {}
        self.last_errors: list[str] = []
        self.events: EventSink = no_events

    # hosts
    @property
    def hosts(self) -> list[SshHost]:
        if self._hosts is None:
            self._hosts = load_hosts(self.hosts_file)
        return self._hosts

    def host(self, name: str) -> SshHost | None:
        return next((h for h in self.hosts if h.name == name), None)

    def check_credentials(self) -> None:
        for h in self.hosts:
            key = Path(h.key)
            if not key.is_file():
                raise CredentialsError(f"{self.hosts_file}: host {h.name}: key file {key} does not exist")
            if not os.access(key, os.R_OK):
                raise CredentialsError(f"{self.hosts_file}: host {h.name}: key file {key} is not readable")

    # ssh
    def _client(self, h: SshHost):
        client = self._clients.get(h.name)
        transport = client.get_transport() if client is not None else None
        if transport is not None and transport.is_active():
            return client
        import paramiko

        if not Path(h.key).is_file():
            raise CredentialsError(f"{self.hosts_file}: host {h.name}: key file {h.key} does not exist")
        provider = self

        class TrustOnFirstUse(paramiko.MissingHostKeyPolicy):
            """Record an unknown host's key in our known_hosts file and say so (never silently)."""

            def missing_host_key(self, client, hostname, key):
                provider._remember_host_key(hostname, key)
                provider.events("ssh-host-key-trusted", {"host": h.name, "address": hostname,
                                                         "key_type": key.get_name(), "fingerprint": _fingerprint(key)})
                log.warning("ssh host %s (%s): first connection, trusting host key %s %s (recorded in %s)",
                            h.name, hostname, key.get_name(), _fingerprint(key), provider.known_hosts)

        client = paramiko.SSHClient()
        try:
            client.load_system_host_keys()  # ~/.ssh/known_hosts, read-only
        except (OSError, paramiko.SSHException):
            pass
        if self.known_hosts.exists():
            # Loaded as "system" keys: checked, but paramiko never rewrites our file on its own.
            client.load_system_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(TrustOnFirstUse())
        try:
            client.connect(h.host, port=h.port, username=h.user, key_filename=h.key, look_for_keys=False,
                           allow_agent=True, passphrase=os.environ.get(PASSPHRASE_ENV), timeout=CONNECT_TIMEOUT,
                           banner_timeout=CONNECT_TIMEOUT, auth_timeout=CONNECT_TIMEOUT)
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise UserError(f"ssh host {h.name} ({h.host}:{h.port}): host key changed (now {_fingerprint(exc.key)}); "
                            f"if that is expected, delete its line from {self.known_hosts}") from None
        except paramiko.PasswordRequiredException:
            client.close()
            raise CredentialsError(f"ssh host {h.name}: key {h.key} is encrypted: load it into ssh-agent "
                                   f"or set {PASSPHRASE_ENV}") from None
        except paramiko.AuthenticationException:
            client.close()
            raise CredentialsError(f"ssh host {h.name}: {h.user}@{h.host}:{h.port} refused key {h.key}") from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            client.close()
            raise HostUnreachable(f"ssh host {h.name} ({h.host}:{h.port}) unreachable: {exc}",
                                  reason=f"{type(exc).__name__}: {exc}") from None
        self._clients[h.name] = client
        return client

    def _remember_host_key(self, hostname: str, key) -> None:
        import paramiko

        keys = paramiko.HostKeys()
        if self.known_hosts.exists():
            keys.load(str(self.known_hosts))
        keys.add(hostname, key.get_name(), key)
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.known_hosts.with_suffix(".tmp")
        keys.save(str(tmp))
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.known_hosts)

    def _call(self, h: SshHost, payload: dict, timeout: float = 120.0) -> dict:
        """Run one helper operation on host `h`.

        A connection that breaks mid-operation (a dropped idle connection, a NAT timeout, sshd
        busy) is dropped and the operation is tried once more on a fresh one: every helper
        operation is safe to repeat (a repeated start adopts the agent the first one started).
        A host that refuses the connection itself is not retried here: the caller moves on."""
        import paramiko
        from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_fixed

        def once() -> tuple[bytes, str, int]:
            client = self._client(h)
            try:
                stdin, stdout, stderr = client.exec_command(_helper_command(h.python), timeout=timeout)
                stdin.write(json.dumps({"workdir": h.workdir, **payload}))
                stdin.channel.shutdown_write()
                out = stdout.read()
                err = stderr.read().decode(errors="replace").strip()
                return out, err, stdout.channel.recv_exit_status()
            except (OSError, paramiko.SSHException, EOFError) as exc:
                self._drop(h)
                raise _ChannelBroke(f"{payload['op']} failed: {type(exc).__name__}: {exc}") from None

        def report(state) -> None:
            exc = state.outcome.exception()
            log.warning("ssh host %s: %s; trying once more on a new connection", h.name, exc)
            self.events("ssh-retry", {"host": h.name, "op": payload["op"], "error": str(exc)})

        try:
            out, err, rc = Retrying(retry=retry_if_exception_type(_ChannelBroke), stop=stop_after_attempt(2),
                                    wait=wait_fixed(1.0), before_sleep=report, reraise=True)(once)
        except _ChannelBroke as exc:
            raise HostUnreachable(f"ssh host {h.name}: {exc}", reason=str(exc)) from None
        if rc == 127:
            raise UserError(f"ssh host {h.name}: the python {h.python!r} was not found there (set 'python' in {self.hosts_file})")
        if rc != 0:
            raise ProviderError(f"ssh host {h.name}: {payload['op']} failed (exit {rc}): {err[-500:]}")
        try:
            return json.loads(out)
        except ValueError:
            raise ProviderError(f"ssh host {h.name}: {payload['op']}: unreadable answer {out[:200]!r}") from None

    def _drop(self, h: SshHost) -> None:
        client = self._clients.pop(h.name, None)
        if client is not None:
            client.close()

    # instances
    def _instance(self, h: SshHost, rec: dict) -> Instance:
        inst = Instance(provider="ssh", id=f"{h.name}:{rec['pid']}", region="ssh", zone=h.name, instance_type=h.name,
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
        return [Offer(CatalogRow(provider="ssh", region="ssh", zone=h.name, instance_type=h.name, gpu=h.gpu,
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
                events("host-unreachable", {"host": h.name, "error": str(exc)})
                why.append(f"{h.name} unreachable ({exc.reason})")
                continue
            reachable.append(h)
            for rec in recs:
                if rec["alive"] and rec.get("token") == spec.token:
                    events("adopted", {"instance": f"{h.name}:{rec['pid']}", "token": spec.token})
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
                events("host-unreachable", {"host": h.name, "error": str(exc)})
                why.append(f"{h.name} unreachable ({exc.reason})")
                continue
            if "busy" in res:
                other = res["busy"].get("tags", {}).get(TAG_RUN, "?")
                events("host-busy", {"host": h.name, "run": other})
                why.append(f"{h.name} busy with run {other}")
                continue
            if "exited" in res:
                last = [line for line in res["log"].splitlines() if line.strip()][-1:] or ["(no output)"]
                raise UserError(f"ssh host {h.name}: the agent exited at once (code {res['exited']}): {last[0][-300:]}; "
                                f"see {res['dir']}/agent.log there")
            rec = res.get("started") or res.get("adopted")
            inst = self._instance(h, rec)
            if "adopted" in res:
                events("adopted", {"instance": inst.id, "token": spec.token})
                inst.adopted = True
            else:
                events("launched", {"instance": inst.id, "host": h.name, "pid": rec["pid"]})
            if keys is not None:
                self._keys_sent[inst.id] = keys.issued
                events("store-credentials", {"instance": inst.id, "expires": keys.expiry()})
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
            events("store-credentials-failed", {"instance": instance_id, "error": str(exc)})
            return False
        if "renewed" not in res:
            return False
        self._keys_sent[instance_id] = keys.issued
        events("store-credentials-renewed", {"instance": instance_id, "expires": keys.expiry()})
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
                        out.append(seen or Instance(provider="ssh", id=f"{name}:{pid}", region="ssh", zone=name,
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
