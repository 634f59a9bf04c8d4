"""The cloud stacks (stacks/aws, stacks/tencent) driven through the Pulumi Automation API.

Each (provider, region) is one Pulumi stack named after the region, in project sdcloud-<provider>.
State lives in a local file backend under $SDCLOUD_HOME/pulumi (no Pulumi Cloud account needed);
stack secrets are encrypted with a passphrase generated once into $SDCLOUD_HOME/pulumi/passphrase
(mode 0600) and handed to the CLI through PULUMI_CONFIG_PASSPHRASE_FILE, never on a command line.

The program runs inline, in this process: it imports `build` from the stack folder, so the stacks
need no virtualenv of their own. The pulumi CLI is a prerequisite (the engine lives there); when it
is missing we say how to install it and touch nothing.

`ensure_infra` is what `sdcloud up` calls: the cached outputs from the state store, or `up` on first
use in a region, then cached.
"""

from __future__ import annotations

import fcntl
import getpass
import importlib.util
import json
import os
import re
import secrets
import shutil
import sys
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

from .. import config
from ..errors import UserError
from ..providers.traits import Stack, has_function, has_stack, names, traits

# The providers with a stack under stacks/ (traits(name).stack).
PROVIDERS = names(where=has_stack)
INSTALL_HINT = ("the pulumi CLI is not installed (sdcloud infra needs it): install it with "
                "`curl -fsSL https://get.pulumi.com | sh`, or see https://www.pulumi.com/docs/install/")
_REGION = re.compile(r"^[a-z]{2,}(-[a-z0-9]+)+$")

Echo = Callable[[str], Any]


@dataclass
class InfraOptions:
    """What the stacks are configured with. None means: from config.toml [infra], else the default."""

    prefix: str | None = None
    ssh_cidr: str | None = None  # None: the caller's public address /32; "" means no SSH at all
    public_key: str | None = None  # a key text or a path to a .pub file; None: ~/.ssh/id_ed25519.pub or id_rsa.pub
    root_volume_gb: int | None = None
    owner_tag: str | None = None
    checkpoint_expire_days: int | None = None
    agent_source: str | None = None
    extra: dict[str, str] = field(default_factory=dict)  # more sdcloud:<key> settings, e.g. instanceType

    def resolved(self) -> "InfraOptions":
        conf = config.settings().get("infra", {})
        if not isinstance(conf, dict):
            raise UserError("config.toml [infra] must be a table")
        pick = lambda name, default: getattr(self, name) if getattr(self, name) is not None else conf.get(name, default)  # noqa: E731
        def whole(name: str, default: int) -> int:
            value = pick(name, default)
            try:
                return int(value)
            except (TypeError, ValueError):
                raise UserError(f"infra: {name} must be a whole number, got {value!r}") from None

        out = InfraOptions(
            prefix=str(pick("prefix", "sdcloud")),
            ssh_cidr=pick("ssh_cidr", None),
            public_key=pick("public_key", None),
            root_volume_gb=whole("root_volume_gb", 200),
            owner_tag=str(pick("owner_tag", "") or _user()),
            checkpoint_expire_days=whole("checkpoint_expire_days", 30),
            agent_source=str(pick("agent_source", os.environ.get("SDCLOUD_AGENT_SOURCE", "sdcloud"))),
            extra={**{str(k): str(v) for k, v in (conf.get("extra") or {}).items()}, **self.extra},
        )
        if out.root_volume_gb <= 0 or out.checkpoint_expire_days < 0:
            raise UserError("infra: root_volume_gb must be positive and checkpoint_expire_days 0 or more")
        if out.ssh_cidr is None:
            out.ssh_cidr = caller_cidr()
        out.public_key = _public_key(out.public_key)
        return out

    def stack_config(self) -> dict[str, str]:
        values = {"prefix": self.prefix, "sshCidr": self.ssh_cidr, "publicKey": self.public_key,
                  "rootVolumeGb": self.root_volume_gb, "ownerTag": self.owner_tag,
                  "checkpointExpireDays": self.checkpoint_expire_days, "agentSource": self.agent_source, **self.extra}
        return {f"sdcloud:{k}": str(v if v is not None else "") for k, v in values.items()}


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no login name in some containers
        return ""


def caller_cidr(timeout: float = 5.0) -> str:
    """This machine's public IPv4 address as /32, or '' (no SSH ingress) when it cannot be found."""
    try:
        with urllib.request.urlopen("https://checkip.amazonaws.com", timeout=timeout) as resp:  # noqa: S310
            ip = resp.read(64).decode().strip()
        if re.fullmatch(r"\d{1,3}(\.\d{1,3}){3}", ip):
            return f"{ip}/32"
    except OSError:
        pass
    print("note: could not find this machine's public address; hosts get no SSH ingress "
          "(set [infra] ssh_cidr in config.toml or pass --ssh-cidr)", file=sys.stderr)
    return ""


def _public_key(value: str | None) -> str:
    if value is None:
        for name in ("id_ed25519.pub", "id_rsa.pub"):
            path = Path.home() / ".ssh" / name
            if path.is_file():
                return path.read_text().strip()
        return ""
    value = value.strip()
    if value.startswith(("ssh-", "ecdsa-")) or not value:
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise UserError(f"public key {value!r} is neither an OpenSSH public key nor a file")
    text = path.read_text().strip()
    if "PRIVATE KEY" in text:
        raise UserError(f"{path} is a private key: give the .pub file")
    return text


def check_target(provider: str, region: str) -> None:
    known = names(where=has_stack)  # asked now: a provider registered since import counts
    if provider not in known:
        raise UserError(f"unknown provider {provider!r}: sdcloud infra knows {', '.join(known)}")
    if not region or not _REGION.match(region):
        raise UserError(f"--region must be a region name such as us-east-1 or ap-guangzhou, got {region!r}")


def pulumi_root() -> str | None:
    """None when `pulumi` is on PATH, else the install root holding bin/pulumi; UserError with the
    install line when there is none (callers check this before they create anything)."""
    if shutil.which("pulumi"):
        return None
    # The installer puts it in ~/.pulumi/bin and only edits PATH for new shells.
    for root in (os.environ.get("PULUMI_HOME"), str(Path.home() / ".pulumi")):
        if root and os.access(Path(root) / "bin" / "pulumi", os.X_OK):
            return root
    raise UserError(INSTALL_HINT, exit_code=2)


def stacks_dir() -> Path:
    # Package data of the sdcloud wheel (in a checkout, a link to the top-level stacks/).
    path = Path(os.environ.get("SDCLOUD_STACKS_DIR") or Path(__file__).resolve().parent / "stacks")
    if not (path / "stack_common.py").is_file():  # what every stack shares: the folder is the stacks'
        raise UserError(f"the Pulumi stacks are not at {path}: set SDCLOUD_STACKS_DIR to the stacks/ folder of sdcloud")
    return path


def backend_dir() -> Path:
    return config.home() / "pulumi"


def passphrase_file() -> Path:
    """$SDCLOUD_HOME/pulumi/passphrase: generated once, 0600; the stack secrets' key."""
    path = backend_dir() / "passphrase"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return path  # another process made it a moment ago
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
    os.chmod(path, 0o600)
    return path


def _stack_of(provider: str) -> Stack:
    """The provider's stack as its traits describe it (folder, program, region key, plugin)."""
    stack = traits(provider).stack
    if stack is None:
        raise UserError(f"{provider} needs no infrastructure: sdcloud infra knows {', '.join(names(where=has_stack))}")
    return stack


def load_stack_module(provider: str) -> ModuleType:
    """Import stacks/<folder>/<module>.py by path (the stacks are not part of the installed package)."""
    stack = _stack_of(provider)
    module_name = stack.module
    if module_name in sys.modules:
        return sys.modules[module_name]
    path = stacks_dir() / stack.folder / f"{module_name}.py"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"cannot load the {provider} stack from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def _program(provider: str) -> Callable[[], None]:
    def program() -> None:
        import pulumi

        module = load_stack_module(provider)
        for name, value in module.build(module.load_config()).items():
            pulumi.export(name, value)

    return program


def _auto() -> ModuleType:
    try:
        from pulumi import automation
    except ImportError:
        raise UserError("the Pulumi SDK is not installed: pip install 'sdcloud[infra]'") from None
    return automation


def _stack(provider: str, region: str, create: bool = True) -> Any:
    """The Automation API stack for (provider, region); checks the CLI before it creates anything."""
    check_target(provider, region)
    root = pulumi_root()
    auto = _auto()
    project = f"sdcloud-{provider}"
    backend = backend_dir()
    backend.mkdir(parents=True, exist_ok=True, mode=0o700)
    # The CLI prefers PULUMI_CONFIG_PASSPHRASE over the file; a user's own passphrase for other
    # projects must not re-key (or fail to open) these stacks.
    os.environ.pop("PULUMI_CONFIG_PASSPHRASE", None)
    work_dir = backend / "work" / provider  # keeps Pulumi.<stack>.yaml (the secrets salt) between runs
    work_dir.mkdir(parents=True, exist_ok=True)
    url = f"file://{backend}"
    opts = auto.LocalWorkspaceOptions(
        work_dir=str(work_dir),
        secrets_provider="passphrase",
        project_settings=auto.ProjectSettings(name=project, runtime="python", backend=auto.ProjectBackend(url=url)),
        env_vars={"PULUMI_BACKEND_URL": url, "PULUMI_CONFIG_PASSPHRASE_FILE": str(passphrase_file()),
                  "PULUMI_SKIP_UPDATE_CHECK": "true"},
        pulumi_command=auto.PulumiCommand(root=root, skip_version_check=True),
    )
    try:
        if create:
            return auto.create_or_select_stack(region, project_name=project, program=_program(provider), opts=opts)
        return auto.select_stack(region, project_name=project, program=_program(provider), opts=opts)
    except auto.StackNotFoundError:
        raise UserError(f"no {provider} stack in {region} yet: "
                        f"run `sdcloud infra up --provider {provider} --region {region}`") from None
    except auto.CommandError as exc:
        raise UserError(_short(exc), exit_code=1) from None


def _short(exc: Exception) -> str:
    """The useful line of a Pulumi CLI failure (its output is long)."""
    lines = []
    for line in str(exc).splitlines():
        line = line.strip()
        for label in ("code:", "stdout:", "stderr:"):
            line = line.removeprefix(label).strip()
        if line and not line.lstrip("-").isdigit():
            lines.append(line)
    errors = [ln for ln in lines if "error" in ln.lower()]
    return "pulumi: " + (errors[-1] if errors else (lines[-1] if lines else "failed"))[:400]


def _validate(provider: str, options: InfraOptions) -> None:
    """Check the settings with the stack's own rules here, rather than as a failed deployment."""
    module = load_stack_module(provider)
    cfg = module.StackConfig(prefix=options.prefix, ssh_cidr=options.ssh_cidr or "",
                             root_volume_gb=options.root_volume_gb, checkpoint_expire_days=options.checkpoint_expire_days)
    try:
        cfg.validate()
    except ValueError as exc:
        raise UserError(str(exc)) from None


# Stacks that declare the cloud driver (issue 27): the providers with a cloud function
# (traits(name).function); `extra` driverPackage="" leaves it out.
DRIVER_PROVIDERS = names(where=has_function)


def driver_package() -> Path:
    """The cloud driver's function zip for this control plane, under $SDCLOUD_HOME/driver/ (one file per version)."""
    from .function_package import PackageError, current

    try:
        package = current()
    except PackageError as exc:  # a dependency the functions' Python cannot run (function_package.py)
        raise UserError(f"the cloud driver's package cannot be built: {exc}", exit_code=1) from None
    over = package.over_limits()
    if over:
        raise UserError("the cloud driver's package is too large: " + "; ".join(over), exit_code=1)
    return package.write(config.home() / "driver")


def _configure(stack: Any, provider: str, region: str, options: InfraOptions) -> None:
    auto = _auto()
    stack_of = _stack_of(provider)
    plugin = stack_of.plugin
    values = {stack_of.region_key: auto.ConfigValue(region)}
    for key, value in options.stack_config().items():
        values[key] = auto.ConfigValue(value, secret=False)
    if provider in names(where=has_function) and "driverPackage" not in options.extra:
        # The cloud driver runs this control plane's own code: its package is built from it here.
        values["sdcloud:driverPackage"] = auto.ConfigValue(str(driver_package()), secret=False)
    stack.set_all_config(values)
    # Install the provider plugin this SDK version expects (the engine would fetch it too, later and quieter).
    version = "v" + metadata.version(stack_of.distribution).lstrip("v")
    try:
        if stack_of.plugin_server:
            stack.workspace.install_plugin_from_server(plugin, version, stack_of.plugin_server)
        else:
            stack.workspace.install_plugin(plugin, version)
    except auto.CommandError as exc:
        raise UserError(f"cannot install the Pulumi {plugin} plugin {version}: {_short(exc)}", exit_code=1) from None


@contextmanager
def _lock(provider: str, region: str) -> Iterator[None]:
    """One sdcloud process per stack at a time (two first `sdcloud up` in a region would race)."""
    path = backend_dir() / f".{provider}-{region}.lock"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _plain(outputs: dict) -> dict:
    return {k: getattr(v, "value", v) for k, v in outputs.items()}


def _run(op: Callable[[], Any]) -> Any:
    auto = _auto()
    try:
        return op()
    except auto.ConcurrentUpdateError:
        raise UserError("another Pulumi operation holds this stack; wait for it, or run `pulumi cancel`", exit_code=1) from None
    except auto.CommandError as exc:
        raise UserError(_short(exc), exit_code=1) from None


def _store():
    from ..runs.records.state import StateStore

    return StateStore()


def _prepare(provider: str, region: str, options: InfraOptions | None) -> tuple[Any, InfraOptions]:
    """Check target, CLI and settings before anything is written; then open the stack."""
    check_target(provider, region)
    pulumi_root()
    opts = (options or InfraOptions()).resolved()
    _validate(provider, opts)
    _account_check(provider, region, opts)
    return _stack(provider, region), opts


def _account_check(provider: str, region: str, options: InfraOptions) -> None:
    """What the account must have for the stack (the provider's traits.infra_check), before anything
    is deployed: one line. Only where the cloud driver is deployed (`extra` driverPackage="" leaves it out)."""
    from ..providers.loader import infra_check

    check = infra_check(provider)
    if check is not None and provider in DRIVER_PROVIDERS and options.extra.get("driverPackage", None) != "":
        check(region)


def up(provider: str, region: str, options: InfraOptions | None = None, on_output: Echo | None = None) -> dict:
    """Create or update the stack; cache and return its outputs."""
    stack, opts = _prepare(provider, region, options)
    with _lock(provider, region):
        _configure(stack, provider, region, opts)
        result = _run(lambda: stack.up(on_output=on_output, color="never"))
    outputs = _plain(result.outputs)
    store = _store()
    try:
        store.save_infra(provider, region, outputs)
    finally:
        store.close()
    return outputs


def preview(provider: str, region: str, options: InfraOptions | None = None, on_output: Echo | None = None) -> dict:
    """What `up` would change: {operation: count}."""
    stack, opts = _prepare(provider, region, options)
    with _lock(provider, region):
        _configure(stack, provider, region, opts)
        result = _run(lambda: stack.preview(on_output=on_output, color="never"))
    return {str(getattr(k, "value", k)): v for k, v in (result.change_summary or {}).items()}


def down(provider: str, region: str, on_output: Echo | None = None) -> None:
    """Destroy every resource of the stack and forget its cached outputs."""
    stack = _stack(provider, region, create=False)
    with _lock(provider, region):
        _run(lambda: stack.destroy(on_output=on_output, color="never"))
        # Drop the emptied stack record too, so that the backend lists only live stacks.
        _run(lambda: stack.workspace.remove_stack(region))
    store = _store()
    try:
        store.delete_infra(provider, region)
    finally:
        store.close()


def outputs(provider: str, region: str) -> dict:
    """The stack's outputs as Pulumi holds them (and refresh the cache with them)."""
    stack = _stack(provider, region, create=False)
    values = _plain(_run(stack.outputs))
    if values:
        store = _store()
        try:
            store.save_infra(provider, region, values)
        finally:
            store.close()
    return values


def cached_outputs(provider: str, region: str) -> dict | None:
    check_target(provider, region)
    store = _store()
    try:
        return store.infra(provider, region) or None
    finally:
        store.close()


def ensure_infra(provider: str, region: str, options: InfraOptions | None = None, on_output: Echo | None = None,
                 refresh: bool = False) -> dict:
    """The outputs the provider launches from: cached, or `up` on first use in the region."""
    if not refresh:
        cached = cached_outputs(provider, region)
        if cached:
            return cached
    if on_output:
        on_output(f"first use of {provider} {region}: creating the sdcloud stack (network, bucket, role, template)")
    return up(provider, region, options, on_output=on_output)


def describe(outputs: dict) -> str:
    return json.dumps(outputs, indent=2, sort_keys=True)
