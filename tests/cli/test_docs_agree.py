"""The docs show what the code does: the quick start's error is the one `offers` prints today, and
docs/runs.md says of cloud batch schedules what docs/batch.md and the cloud driver do (the function
fires them and steps the jobs; `sdcloud scheduler` is for local and SSH schedules only). Fast."""

from __future__ import annotations

import re

from sdcloud.cli import main
from tests.support import ROOT


def test_the_quick_starts_error_is_the_one_printed(capsys, sdcloud_home):
    text = (ROOT / "docs" / "quickstart.md").read_text()
    shown = re.search(r"^\$ sdcloud (offers .*)\n(error: .*)$", text, re.M)
    assert shown, "the quick start shows a bad input and its error"
    code = main(shown.group(1).split())
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1] == shown.group(2)


def test_runs_and_batch_docs_agree_on_cloud_schedules():
    from sdcloud.driver import batch_jobs  # the function's batch part exists

    runs = " ".join((ROOT / "docs" / "runs.md").read_text().split())
    batch = " ".join((ROOT / "docs" / "batch.md").read_text().split())
    assert batch_jobs.__doc__ and "batch-fire" in batch_jobs.__doc__
    assert "on the cloud's own scheduler" in batch and "sdcloud/driver/batch_jobs.py" in batch
    assert "sdcloud/driver/batch_jobs.py" in runs
    assert "cloud batch schedules still fire from" not in runs
    assert "the cloud driver takes training runs, not batch jobs" not in runs
