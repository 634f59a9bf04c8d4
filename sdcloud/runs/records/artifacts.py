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


def run_store(run: dict):
    """The run's store, opened as this machine reaches it (the readers of records/samples.py and
    records/metrics.py take it)."""
    return _store_and_url(run)[0]


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
    return _fetch(store, infos, prefix, dest) + pull_curves(store, run["id"], dest)


def _fetch(store, infos, prefix: str, dest: Path) -> list[Path]:
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


def pull_curves(store, run_id: str, dest: Path) -> list[Path]:
    """The run's TensorBoard event files (ours and the trainer's) into dest/tensorboard/, so that
    `tensorboard --logdir DIR/tensorboard` shows the curves of a pulled run."""
    from sdcloud_agent.metrics import TENSORBOARD

    from .store import StoreError

    prefix = f"runs/{run_id}/{TENSORBOARD}/"
    try:
        infos = store.list(prefix)
    except StoreError:
        return []  # the model is what a pull is for; the curves a nicety
    return _fetch(store, infos, prefix, dest / TENSORBOARD)


# -- the checkpoint you pick: `sdcloud pull RUN --step N`, `pull --list` ------------------------------------

EXPORT = "export/"  # in a checkpoint: the model at that step as the final artifacts have it (builtin, kohya)
# The file a diffusers LoRA script's save_state writes into checkpoint-N (its save_model_hook).
DIFFUSERS_LORA = "pytorch_lora_weights.safetensors"


def kept_checkpoints(store, run_id: str) -> list[dict]:
    """The run's complete checkpoints in its store, oldest first: step, size, time, whether `pull --step`
    gets a model from it, and how many samples it has (with their keys)."""
    from sdcloud_agent import manifest

    from .samples import list_samples

    prefix = f"runs/{run_id}"
    by_step: dict[int, list] = {}
    for s in list_samples(store, run_id):
        by_step.setdefault(s.step, []).append(s)
    out = []
    for step in manifest.complete_steps(store, prefix):
        m = manifest.read(store, prefix, step)
        if m is None:
            continue
        out.append({"step": step, "bytes": m.total_bytes, "created": m.created, "trainer": m.trainer,
                    "model_files": [f.path for f in _model_files(m)],
                    "samples": [s.key for s in sorted(by_step.get(step, []), key=lambda s: s.index)]})
    return out


def _model_files(m) -> list:
    """The files of a checkpoint that make its model: its export/ folder, else the LoRA file a diffusers
    script's save_state leaves at the top (pytorch_lora_weights.safetensors)."""
    export = [f for f in m.files if f.path.startswith(EXPORT)]
    if export:
        return export
    return [f for f in m.files if f.path == DIFFUSERS_LORA]


def pull_step(run: dict, dest: Path, step: int) -> list[Path]:
    """The model at checkpoint `step` into dest, as `pull` lays out the final one; each file checked
    against the manifest's sha256."""
    from sdcloud_agent import manifest
    from sdcloud_agent.store import sha256_file

    from .store import StoreError

    store, _ = _store_and_url(run)
    prefix = f"runs/{run['id']}"
    try:
        steps = manifest.complete_steps(store, prefix)
        m = manifest.read(store, prefix, step) if step in steps else None
    except StoreError as exc:
        raise UserError(f"cannot read the checkpoints of run {run['id']}: {exc}") from None
    if m is None:
        kept = ", ".join(map(str, steps)) or "none"
        raise UserError(f"run {run['id']} has no checkpoint at step {step} (kept: {kept}); see: sdcloud pull {run['id']} --list")
    files = _model_files(m)
    if not files:
        raise UserError(f"checkpoint {step} of run {run['id']} holds no model file that pull can give "
                        f"(a DreamBooth checkpoint keeps the trainer's state only)")
    base = manifest.checkpoint_prefix(prefix, step)
    out = []
    for f in files:
        rel = f.path[len(EXPORT):] if f.path.startswith(EXPORT) else f.path
        if not rel or rel.startswith("/") or ".." in Path(rel).parts:
            continue  # never write outside dest
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if not (target.is_file() and target.stat().st_size == f.size and sha256_file(target) == f.sha256):
            store.get_file(f"{base}/{f.path}", target)
            if sha256_file(target) != f.sha256:
                raise UserError(f"{base}/{f.path} changed in the store while it was read: pull again")
        out.append(target)
    readme = dest / "README.md"
    if readme not in out:
        readme.write_text(f"# sdcloud run {run['id']}, checkpoint {step}\n\nThe LoRA at step {step} of "
                          f"{run.get('total_steps') or '?'}: load it as the final one "
                          "(`pipe.load_lora_weights(DIR)`).\n", encoding="utf-8")
        out.append(readme)
    return out + pull_curves(store, run["id"], dest)
