"""The CLI run in this process as a user runs it, for the checks made before anything is recorded:
`refused` (exit 2, one line on stderr naming the fault), `nothing_recorded`, and a captioned
`dataset` folder (a fixture: import it into a test module to use it)."""

from __future__ import annotations

import pytest

from sdcloud.cli import main


def refused(capsys, args: list[str], needle: str) -> str:
    """`sdcloud ARGS` exits 2 with one line on stderr holding `needle`; that line."""
    rc = main(args)
    out = capsys.readouterr()
    assert rc == 2, (args, out.err)
    assert out.err.count("\n") == 1 and needle in out.err, out.err
    return out.err


def nothing_recorded() -> None:
    from sdcloud.runs.records.state import StateStore

    assert StateStore().list_runs() == []


@pytest.fixture
def dataset(tmp_path):
    """Two small images with their captions, as a user's training folder."""
    from PIL import Image

    folder = tmp_path / "dataset"
    folder.mkdir()
    for i in range(2):
        Image.new("RGB", (16, 16), (i * 90, 40, 200)).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"a photo of sks thing number {i}")
    return folder
