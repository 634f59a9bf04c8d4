"""A local dataset folder, checked before launch: the layout in docs/training.md."""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError


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
