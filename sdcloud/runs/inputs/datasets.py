"""A local dataset folder, checked before launch: the layout in docs/training.md."""

from __future__ import annotations

from pathlib import Path

from ...errors import UserError


def check_dataset(folder: Path):
    """Refuse (one line) an empty folder, unreadable images, or files that are neither images nor
    captions, naming them; return the scan (count, captions, smallest size) for the summary."""
    from sdcloud_agent.trainers.datasets import scan

    if not folder.is_dir():
        raise UserError(f"dataset {folder} is not a folder of images")
    result = scan(folder)
    problem = result.problem()
    if problem:
        raise UserError(problem)
    return result


# A run's id as controller.new_run_id makes it: "r-" and 8 hex digits.
RUN_ID_CHARS = 10


def check_keys(folder: Path, limit: int, store_url: str | None) -> None:
    """Refuse (one line) a dataset file whose key in the run's bucket (upload_dataset's
    `<store prefix>/runs/<run>/dataset/<path>`) would be longer than the bucket takes."""
    from urllib.parse import urlparse

    prefix = urlparse(store_url).path.strip("/") if store_url else "sdcloud"  # sdcloud infra's prefix
    head = len(f"{prefix}/runs/{'r' * RUN_ID_CHARS}/dataset/".encode())
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = f.relative_to(folder).as_posix()
        if head + len(rel.encode()) > limit:
            shown = rel if len(rel) <= 80 else rel[:40] + "..." + rel[-37:]
            raise UserError(f"dataset file {shown} makes a {head + len(rel.encode())}-byte key in the bucket, "
                            f"over the {limit} bytes it takes: shorten its path")


def upload_dataset(store, store_url: str, run_id: str, dataset: str, event) -> str:
    """Put a local dataset (a folder, or one file) in the run's bucket once; the host's URL for it.

    A driver that starts again lists what is there and sends only what is missing (same size)."""
    import time

    from ...events import Kind

    root = Path(dataset).expanduser()
    prefix = f"runs/{run_id}/dataset"
    have = {o.key: o.size for o in store.list(prefix + "/")}
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    start, sent, size = time.time(), 0, 0
    for f in files:
        key = f"{prefix}/{f.relative_to(root).as_posix() if root.is_dir() else f.name}"
        if have.get(key) != f.stat().st_size:  # a restarted controller sends only what is missing
            store.put_file(key, f)
            sent, size = sent + 1, size + f.stat().st_size
    event(Kind.DATASET_UPLOADED, {"files": len(files), "sent": sent, "mb": round(size / 1e6, 2),
                                  "seconds": round(time.time() - start, 2)})
    return store_url.rstrip("/") + "/" + prefix
