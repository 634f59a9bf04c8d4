"""At COLUMNS=80 no line of `offers --explain`, `up`'s summary, `cost report` or `batch status` is
over 80 columns, and nothing the footer explains is hidden (issue 39). Fast: rows and a folder
bucket written by the test, the bundled catalog."""

from __future__ import annotations

import time

import pytest

from sdcloud.cli import main

WIDTH = 80


def _lines(capsys, monkeypatch, *args: str) -> list[str]:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    try:
        rc = main(list(args))
    except SystemExit as exc:  # up's summary ends with the run's exit code
        rc = exc.code
    out = capsys.readouterr()
    assert rc in (0, 1), (args, out.err)
    lines = out.out.splitlines()
    too_long = [ln for ln in lines if len(ln) > WIDTH]
    assert not too_long, f"{' '.join(args)}: {len(too_long)} lines over {WIDTH}:\n" + "\n".join(too_long)
    return lines


def test_offers_explain_shows_every_input_at_80_columns(capsys, monkeypatch, sdcloud_home):
    lines = _lines(capsys, monkeypatch, "offers", "--tier", "sdxl-lora", "--explain", "--limit", "4")
    text = " ".join(ln.strip() for ln in lines)
    assert "hidden to fit" not in text
    monkeypatch.setenv("COLUMNS", "400")  # the same rows, one table: each input is in the lines at 80
    assert main(["offers", "--tier", "sdxl-lora", "--limit", "4", "--json"]) == 0
    import json

    for n, row in enumerate(json.loads(capsys.readouterr().out), 1):
        entry = next(ln for ln in lines if ln.startswith(f"{n}. "))
        after = lines[lines.index(entry):]  # the entry's wrapped lines, up to the next entry or the footer
        end = next((i for i, ln in enumerate(after[1:], 1) if ln.startswith(f"{n + 1}. ") or not ln.strip()), len(after))
        block = " ".join(ln.strip() for ln in after[:end])
        for word in ("price", "speed", "interruption", "overhead", row["instance_type"], f"{row['est_cost']:.2f}"):
            assert word in block, (word, block)
    # The footer's formula names overhead and est h: both are in every row's line.
    assert "overhead = 1 + reclaims/h" in text and "est h = (" in text


def _training_run(state, bucket, rid: str = "r-80c0aaaa") -> None:
    state.create_run(rid, "sd15-lora", {"tier": "sd15-lora", "provider": "local", "model": "tiny",
                                        "store": bucket.as_uri()}, 40, name="a-rather-long-run-name-for-width")
    now = time.time()
    for n, (start, end, why) in enumerate(((now - 900, now - 600, "preempted"), (now - 590, now - 5, "succeeded")), 1):
        state.add_attempt(rid, n, "local", f"t{n}", region="local", zone="local", instance_type="this-machine",
                          market="spot", price=0.5, currency="USD")
        state.update_attempt(rid, n, state="ended", start=start, end=end, end_reason=why)
        state.set_attempt_costs(rid, n, currency="USD", quote_price=0.5, ondemand_price=0.5, disk_gb=0.0)
    state.update_run(rid, state="succeeded", step=40)


@pytest.fixture
def deep_bucket(tmp_path):
    """A bucket folder with a long path, as a user's home can have."""
    folder = tmp_path / "a-folder-with-a-long-name" / "another-long-folder-name" / "sdcloud-bucket-for-this-test"
    folder.mkdir(parents=True)
    return folder


def test_up_summary_and_its_path_line_fit_80_columns(capsys, monkeypatch, sdcloud_home, deep_bucket):
    from sdcloud.commands.run import _run_ended
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    _training_run(state, deep_bucket)
    assert len(f"the model is in {deep_bucket.as_uri()}/runs/r-80c0aaaa/artifacts/") > WIDTH
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    _run_ended(state, "r-80c0aaaa", False)
    out = capsys.readouterr().out
    assert out and all(len(ln) <= WIDTH for ln in out.splitlines()), out
    joined = "".join(ln.strip() for ln in out.splitlines())
    assert "artifacts/;download it with: sdcloud pull r-80c0aaaa [DIR]" in joined.replace("; ", ";")


def test_cost_report_and_batch_status_fit_80_columns(capsys, monkeypatch, sdcloud_home, deep_bucket, tmp_path):
    from sdcloud.batch import jobs
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    _training_run(state, deep_bucket)
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red fox\na blue whale\n")
    sdcloud_home.mkdir(parents=True, exist_ok=True)
    (sdcloud_home / "config.toml").write_text("[local]\nprice_per_hour = 0.75\n")
    job = jobs.submit(jobs.SubmitOptions(tier="batch-sd15", model="tiny", prompts=str(prompts), workers=1,
                                         provider="local", generator="fake", name="nightly-product-shots"))["job"]
    jobs.run_local(job, ttl=5.0, poll=0.1)
    report = _lines(capsys, monkeypatch, "cost", "report", "--all", "--by", "tier")
    text = " ".join(ln.strip() for ln in report)
    assert f"job {job}" in text and "run r-80c0aaaa" in text and "per 1k images" in text
    assert "runs and jobs: total $" in text
    status = _lines(capsys, monkeypatch, "batch", "status", job)
    assert any("cost_per_1k_images_usd" in ln for ln in status)
