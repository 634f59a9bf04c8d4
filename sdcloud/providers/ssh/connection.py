"""SSH to the user's boxes: connections with trust-on-first-use host keys, and one helper operation per exec.

Every operation on a box is host_helper.py run with the box's own Python: one SSH exec, JSON in on
stdin, JSON out on stdout, no shell quoting of payloads. A connection that breaks mid-operation is
dropped and the operation tried once more (`ssh-retry`); a host that refuses the connection is
HostUnreachable, and the caller moves on.

Host keys: trust on first use, recorded in $SDCLOUD_HOME/ssh_known_hosts (the user's
~/.ssh/known_hosts is consulted too, read-only); a changed key stops with a UserError.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
from importlib import resources
from pathlib import Path

from ... import config
from ...errors import UserError
from ...events import Kind
from ..base import CredentialsError, EventSink, ProviderError, no_events
from .hosts import SshHost, hosts_path, load_hosts

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 15.0
PASSPHRASE_ENV = "SDCLOUD_SSH_KEY_PASSPHRASE"


def _helper_source() -> str:
    """The host-side helper (host_helper.py), read as text: it runs on the box, not here."""
    return resources.files(__package__).joinpath("host_helper.py").read_text()


def _helper_command(python: str) -> str:
    # Base64 keeps the command free of newlines and quotes whatever the login shell is.
    code = base64.b64encode(_helper_source().encode()).decode()
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


class SshConnections:
    """The hosts file, and one live SSH connection per host of it (the provider builds on it)."""

    def __init__(self, hosts_file: str | os.PathLike | None = None, known_hosts: str | os.PathLike | None = None):
        self.hosts_file = hosts_path(hosts_file)
        self.known_hosts = Path(known_hosts) if known_hosts else config.home() / "ssh_known_hosts"
        self._hosts: list[SshHost] | None = None
        self._clients: dict[str, object] = {}
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
                provider.events(Kind.SSH_HOST_KEY_TRUSTED, {"host": h.name, "address": hostname,
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
            self.events(Kind.SSH_RETRY, {"host": h.name, "op": payload["op"], "error": str(exc)})

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
