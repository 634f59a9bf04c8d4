"""Trainer sources: the code of the external trainers, put on the host when the run's trainer is one
of them (the agent's boot phase `trainer`).

    kohya      sd-scripts at the commit pinned in data/trainer-sources.txt, and a venv of its own
               for its requirements (they pin their own diffusers, transformers, accelerate)
    diffusers  the example scripts (`examples/`) from the diffusers tag that matches the diffusers
               installed in the training environment, and a venv of their own for what they need
               beyond it (data/examples-lock.txt: torchvision, datasets, ftfy, tensorboard, ...)

Each tree is fetched with git (`git fetch --depth 1 <url> <commit or tag>`; by commit, git checks
every object against its hash), packed as a tar and kept in the run's bucket, written to a temp key
and copied into place like the models:

    cache/trainers/kohya-<sha12>.tar                                the sd-scripts tree
    cache/trainers/kohya-venv-<sha12>-<env key>.tar.zst             its venv (env key: lock, build, python)
    cache/trainers/diffusers-examples-<tag>.tar                     the examples tree
    cache/trainers/diffusers-examples-venv-<lock sha12>-<env key>.tar.zst   their venv

A later boot restores them instead of fetching. Both venvs are made the same way (layered_venv),
with the training environment's python; a `.pth` file puts (kohya) the sd-scripts tree (what its
`-e .` line would install: the `library` package) and then the training environment's
site-packages after the venv's own, so it reuses our torch and every package its requirements do
not pin otherwise, while its own pins shadow ours. That `.pth` is written again after every
restore: paths differ between hosts. The examples' lock is installed with our lock and torch pin as
constraints (it never shadows them), torchvision first from the torch build's index: it is built
for one torch, and is kept out of the main lock (its PyPI build beside the CPU torch breaks
`import diffusers` on CI).

The adapters then run `<venv python> -m accelerate.commands.launch <absolute script>`: nothing from
PATH. The config's `trainer_sources` overrides the URLs and refs ({"kohya_url", "kohya_commit",
"diffusers_url", "diffusers_tag"}) for a mirror or a test's local repository, and
"diffusers_examples_lock" (a path) replaces data/examples-lock.txt.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

log = logging.getLogger("sdcloud_agent.scripts")

EXTERNAL = ("kohya", "diffusers")
COMPLETE = ".sdcloud-complete"
PTH = "sdcloud-layers.pth"


class SourceError(RuntimeError):
    pass


@dataclass
class Sources:
    tree: Path  # the checked-out tree: kohya scripts at its root, the diffusers ones under examples/
    python: str  # the interpreter that runs accelerate and the script
    how: str  # restored | fetched | local
    commit: str = ""


def pins() -> dict[str, tuple[str, str]]:
    """{name: (url, ref)} from data/trainer-sources.txt."""
    text = resources.files("sdcloud_agent").joinpath("data", "trainer-sources.txt").read_text()
    out = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, url, ref = line.split()
            out[name] = (url, ref)
    return out


def is_accelerate_launch(launcher) -> bool:
    if isinstance(launcher, str):
        import shlex

        launcher = shlex.split(launcher)
    return bool(launcher) and [str(a) for a in launcher[:2]] == ["accelerate", "launch"]


def needed(trainer: str, trainer_args) -> bool:
    """Does this run need a trainer's sources? Not with a launcher of the user's own (other than
    `accelerate launch ...`) or an absolute script path: those are used as given."""
    if trainer not in EXTERNAL:
        return False
    args = trainer_args if isinstance(trainer_args, dict) else {}
    if "launcher" in args and not is_accelerate_launch(args["launcher"]):
        return False
    return not os.path.isabs(str(args.get("script") or ""))


@dataclass
class Archive:
    """One trainer's source tree as the bucket keeps it: cache/trainers/<name>.tar."""
    name: str
    url: str
    ref: str  # a commit sha, or refs/tags/<tag>
    what: str
    sparse: str | None = None

    @property
    def key(self) -> str:
        return f"cache/trainers/{self.name}.tar"


def archive(trainer: str, overrides: dict | None = None, diffusers_version: str | None = None) -> Archive:
    """Which source tree a run of `trainer` needs (the pins, or the config's overrides). The
    control plane calls it too, with the diffusers version of the host's lock, to carry the tree
    through the bucket."""
    overrides = overrides or {}
    url, ref = pins()[trainer]
    if trainer == "kohya":
        url = overrides.get("kohya_url") or url
        commit = str(overrides.get("kohya_commit") or ref)
        if not re.fullmatch(r"[0-9a-f]{40}", commit):
            raise SourceError(f"kohya commit {commit!r} is not a full 40-digit sha: the pin is a commit, not a tag")
        return Archive(f"kohya-{commit[:12]}", url, commit, f"kohya sd-scripts commit {commit}")
    if diffusers_version is None:
        import importlib.metadata

        diffusers_version = importlib.metadata.version("diffusers")
    url = overrides.get("diffusers_url") or url
    tag = str(overrides.get("diffusers_tag") or ref.format(version=diffusers_version))
    return Archive(f"diffusers-examples-{tag}", url, f"refs/tags/{tag}",
                   f"diffusers examples tag {tag} (for the installed diffusers {diffusers_version})", "examples")


def pack(a: Archive, dest_tar: Path) -> str:
    """Fetch `a` with git and pack it as the bucket keeps it; the commit."""
    tmp = Path(tempfile.mkdtemp(prefix=".sdcloud-src-"))
    try:
        commit = fetch(a.url, a.ref, tmp / a.name, a.what, a.sparse)
        dest_tar.parent.mkdir(parents=True, exist_ok=True)
        _tar(tmp / a.name, dest_tar)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return commit


def stage(trainer: str, store, root: Path, overrides: dict | None = None) -> Sources:
    """The trainer's sources under `root/trainers/`, from the bucket's cache or fetched and cached.
    With overrides["bucket_only"] (the network's trainer_sources = "bucket") nothing is fetched:
    a tree the bucket does not hold is an error."""
    overrides = overrides or {}
    a = archive(trainer, overrides)
    only = bool(overrides.get("bucket_only"))
    if trainer == "kohya":
        tree, how, _ = _tree(store, root, a.name, a.url, a.ref, a.what, bucket_only=only)
        python, vhow = _kohya_venv(store, root, tree, a.ref)
        return Sources(tree, python, _combined(how, vhow), a.ref)
    tree, how, commit = _tree(store, root, a.name, a.url, a.ref, a.what, sparse=a.sparse, bucket_only=only)
    if not (tree / "examples").is_dir():
        raise SourceError(f"{a.what} from {a.url} has no examples/ folder")
    python, vhow = _examples_venv(store, root, overrides)
    return Sources(tree, python, _combined(how, vhow), commit)


def _combined(*hows: str) -> str:
    for h in ("fetched", "restored"):
        if h in hows:
            return h
    return "local"


def _git(*args: str, cwd: Path | None = None) -> str:
    git = shutil.which("git")
    if git is None:
        raise SourceError("git is not installed on this host: it fetches the trainer's sources")
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    p = subprocess.run([git, *args], cwd=cwd, capture_output=True, text=True, env=env, check=False)
    if p.returncode != 0:
        raise SourceError((p.stderr or p.stdout).strip().splitlines()[-1] if (p.stderr or p.stdout).strip()
                          else f"git {args[0]} exited {p.returncode}")
    return p.stdout.strip()


def fetch(url: str, ref: str, dest: Path, what: str, sparse: str | None = None) -> str:
    """Check out `ref` (a commit sha or refs/tags/...) of `url` into `dest`, without its history;
    the commit checked out."""
    dest.mkdir(parents=True)
    try:
        _git("init", "-q", str(dest))
        _git("remote", "add", "origin", url, cwd=dest)
        fetch_args = ["fetch", "-q", "--depth", "1"]
        if sparse:
            # Only the folder's files are downloaded (a server without filters sends them all).
            _git("config", "remote.origin.promisor", "true", cwd=dest)
            _git("config", "remote.origin.partialclonefilter", "blob:none", cwd=dest)
            _git("sparse-checkout", "set", sparse, cwd=dest)
            fetch_args.append("--filter=blob:none")
        _git(*fetch_args, "origin", ref, cwd=dest)
        _git("checkout", "-q", "--detach", "FETCH_HEAD", cwd=dest)
        commit = _git("rev-parse", "HEAD", cwd=dest)
    except SourceError as exc:
        raise SourceError(f"cannot fetch {what} from {url}: {exc}") from None
    if re.fullmatch(r"[0-9a-f]{40}", ref) and commit != ref:
        raise SourceError(f"{what}: fetched {commit}, not the pinned {ref}")
    shutil.rmtree(dest / ".git")
    (dest / ".sdcloud-source").write_text(f"{url} {ref} {commit}\n")
    return commit


def _put(store, key: str, path: Path) -> None:
    part = key + ".part"  # whole or not at all: a restore never sees a half-written cache
    store.put_file(part, path)
    store.copy(part, key)
    store.delete(part)


def _tar(src: Path, tar_path: Path, compress: str | None = None) -> None:
    cmd = ["tar", "-C", str(src.parent)] + (["-I", compress] if compress else []) + ["-cf", str(tar_path), src.name]
    subprocess.run(cmd, check=True)


def _untar(tar_path: Path, into: Path, compress: str | None = None) -> None:
    into.mkdir(parents=True, exist_ok=True)
    cmd = ["tar", "-C", str(into)] + (["-I", compress.split()[0]] if compress else []) + ["-xf", str(tar_path)]
    subprocess.run(cmd, check=True)


def _tree(store, root: Path, name: str, url: str, ref: str, what: str, sparse: str | None = None,
          bucket_only: bool = False):
    """(tree, how, commit) of one source tree at root/trainers/<name>."""
    dest = root / "trainers" / name
    key = f"cache/trainers/{name}.tar"
    if (dest / COMPLETE).exists():
        return dest, "local", (dest / COMPLETE).read_text().strip()
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".tmp-"))
    try:
        packed = tmp / "tree.tar"
        if store.head(key) is not None:
            store.get_file(key, packed)
            _untar(packed, tmp / "x")
            got = tmp / "x" / name
            commit = (got / ".sdcloud-source").read_text().split()[-1]
            how = "restored"
        elif bucket_only:
            raise SourceError(f"{what}: the run's bucket has no {key} and this host's network takes trainer "
                              "sources from the bucket only (network.trainer_sources = \"bucket\"); the "
                              "control plane puts it there at launch (docs/providers-tencent.md)")
        else:
            got = tmp / "x" / name
            commit = fetch(url, ref, got, what, sparse)
            _tar(got, packed)
            _put(store, key, packed)
            how = "fetched"
        (got / COMPLETE).write_text(commit)
        os.replace(got, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("%s %s (%s, commit %s)", what, how, key, commit)
    return dest, how, commit


def env_tag() -> str:
    """The training environment's cache identity (lock hash, torch build, python): the kohya venv
    is layered on that environment."""
    from . import boot, gpu

    key, _ = boot.env_key(gpu.host_torch_build())
    return Path(key).name.split(".tar")[0]


def _compressor() -> tuple[str, str | None]:
    return (".tar.zst", "zstd -T0 -3") if shutil.which("zstd") else (".tar.gz", "gzip -1")


def _site_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def write_layers(venv: Path, tree: Path | None = None) -> None:
    """The `.pth` that puts the tree (if any) and then the training environment after the venv's own
    packages."""
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / PTH).write_text("\n".join([*([str(tree)] if tree else []), *_site_dirs()]) + "\n")


def requirements(tree: Path) -> str:
    """kohya's requirements.txt without its `-e .` (the tree is put on the venv's path instead), and
    with `opencv-python` replaced by `opencv-python-headless` at the same pin: the full build links
    libGL.so.1, which server images lack (import cv2 fails), and kohya uses no GUI part of it."""
    lines = (tree / "requirements.txt").read_text().splitlines() if (tree / "requirements.txt").exists() else []
    kept = [ln for ln in lines if not re.fullmatch(r"\s*(-e|--editable)?\s*\.\s*(#.*)?", ln)]
    return "\n".join(re.sub(r"^(\s*)opencv-python(?![-\w])", r"\1opencv-python-headless", ln) for ln in kept) + "\n"


def _pip(python: str, args: list[str], what: str, cwd: Path | None = None) -> None:
    """`python -m pip install <args>`, its output in the log; SourceError with its tail on failure."""
    p = subprocess.run([python, "-m", "pip", "install", "--no-input", "--disable-pip-version-check", *args],
                       cwd=cwd, capture_output=True, text=True, check=False)
    for line in (p.stdout + p.stderr).splitlines():
        log.info("pip: %s", line)
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-10:])
        raise SourceError(f"installing {what} failed:\n{tail}")


def layered_venv(store, root: Path, name: str, mark: str, what: str, install, tree: Path | None = None) -> tuple[str, str]:
    """(python, how) of the venv `root/trainers/<name>`, layered on the training environment by
    `sdcloud-layers.pth` (`tree`, if any, then our site-packages after its own packages): restored
    from `cache/trainers/<name>.tar.zst` in the bucket, or made and `install(python, tmp)`ed, then
    packed and cached. `mark` is written in its complete marker. how: local | restored | fetched."""
    ext, compress = _compressor()
    dest = root / "trainers" / name
    python = str(dest / "bin" / "python")
    key = f"cache/trainers/{name}{ext}"
    if (dest / COMPLETE).exists():
        write_layers(dest, tree)
        return python, "local"
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".tmp-"))
    try:
        packed = tmp / f"venv{ext}"
        if store.head(key) is not None:
            store.get_file(key, packed)
            _untar(packed, tmp / "x", compress)
            how = "restored"
        else:
            venv = tmp / "x" / name
            # The base interpreter of the training environment (venv resolves it), so that the
            # cached venv works on any host with the same image.
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            write_layers(venv, tree)  # before pip: it sees our torch and does not install another
            install(str(venv / "bin" / "python"), tmp)
            _tar(venv, packed, compress)
            _put(store, key, packed)
            how = "installed"
        got = tmp / "x" / name
        (got / COMPLETE).write_text(mark)
        os.replace(got, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_layers(dest, tree)  # this host's paths
    log.info("%s %s (%s)", what, how, key)
    return python, "fetched" if how == "installed" else how


def _kohya_venv(store, root: Path, tree: Path, commit: str) -> tuple[str, str]:
    def install(python: str, tmp: Path) -> None:
        req = tmp / "requirements.txt"
        req.write_text(requirements(tree))
        log.info("kohya venv: pip install -r requirements.txt (sd-scripts %s)", commit[:12])
        _pip(python, ["-r", str(req)], "kohya sd-scripts' requirements", cwd=tree)

    return layered_venv(store, root, f"kohya-venv-{commit[:12]}-{env_tag()}", commit, "kohya venv", install, tree)


PAIRED = "torchvision"  # built for one torch: installed from the torch build's index


def examples_lock(overrides: dict | None = None) -> str:
    """The text of the diffusers examples' lock: data/examples-lock.txt, or the file the config's
    `trainer_sources.diffusers_examples_lock` names (a mirror's or a test's)."""
    path = (overrides or {}).get("diffusers_examples_lock")
    if path:
        return Path(path).read_text()
    return resources.files("sdcloud_agent").joinpath("data", "examples-lock.txt").read_text()


def lock_pins(text: str) -> dict[str, str]:
    """{normalized name: version} of a lock's `name==version` lines."""
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)\s*(#.*)?", line)
        if m:
            out[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    return out


def examples_plan(text: str, build: str, torch_version: str = "") -> tuple[list[str] | None, str]:
    """(pip arguments for torchvision, or None when the lock has none; the rest of the lock as a
    requirements text). torchvision comes from the index its torch came from: a CUDA build's from
    the torch build's index, as boot.py takes torch (the package index when torch came from there:
    no local label); on a CPU host from the package index, unless
    the installed torch is a `+cpu` build (CI's wheel on disk), whose pair is on the CPU index (the
    package index's torchvision is built for its CUDA torch: beside a +cpu torch it fails at import
    with "operator torchvision::nms does not exist")."""
    from . import gpu

    label = torch_version.partition("+")[2]
    index = build if build != "cpu" else ("cpu" if label == "cpu" else None)
    if build != "cpu" and torch_version and not label:
        # A CUDA torch without a local label is the package index's own (PyPI's wheel, boot.py:
        # torch_install_args): its torchvision pair is there too, and a mainland mirror has both.
        index = None
    paired, rest = None, []
    for line in text.splitlines():
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line.split("#", 1)[0])
        if m and m.group(1).lower() == PAIRED:
            paired = [line.split("#", 1)[0].strip()] + (["--index-url", gpu.torch_index(index)] if index else [])
        else:
            rest.append(line)
    return paired, "\n".join(rest) + "\n"


def _examples_venv(store, root: Path, overrides: dict | None) -> tuple[str, str]:
    import importlib.metadata

    from . import boot, gpu

    text = examples_lock(overrides)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    build = gpu.host_torch_build()
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = ""

    def install(python: str, tmp: Path) -> None:
        # Our lock and torch pin as constraints: pip fails rather than shadow one of them.
        cons = tmp / "constraints.txt"
        cons.write_text(boot.TORCH_PIN + "\n" + boot.lock_text(build))
        req = tmp / "examples-lock.txt"
        paired, rest = examples_plan(text, build, torch_version)
        req.write_text(rest)
        if paired:
            log.info("diffusers examples venv: pip install %s", " ".join(paired))
            _pip(python, [*paired, "-c", str(cons)], "torchvision for the diffusers examples")
        log.info("diffusers examples venv: pip install -r examples-lock.txt (%s)", digest)
        _pip(python, ["-r", str(req), "-c", str(cons)], "the diffusers examples' requirements")

    return layered_venv(store, root, f"diffusers-examples-venv-{digest}-{env_tag()}", digest,
                        "diffusers examples venv", install)
