"""`sdcloud pull` and `sdcloud batch pull` write only into a new or empty folder, or an earlier pull of
the same run or job; any other folder needs --force (issue 23: a pull overwrote the user's README.md
and a batch pull mixed two jobs' images)."""

from __future__ import annotations

from pathlib import Path

from sdcloud.cli import main


def _run_with_artifacts(sdcloud_home: Path, run_id: str) -> None:
    from sdcloud.runs.inputs.spec import RunSpec
    from sdcloud.runs.records.state import StateStore
    from sdcloud_agent.store import open_store

    StateStore().create_run(run_id, "sd15-lora", RunSpec(tier="sd15-lora", provider="local").as_dict(), 10)
    store = open_store((sdcloud_home / "bucket").resolve().as_uri())
    store.put(f"runs/{run_id}/artifacts/pytorch_lora_weights.safetensors", b"lora" * 10)
    store.put(f"runs/{run_id}/artifacts/README.md", b"# the run's readme\n")


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_pull_refuses_a_folder_of_other_files_and_refreshes_its_own(tmp_path, sdcloud_home, capsys):
    _run_with_artifacts(sdcloud_home, "r-0000aaaa")
    _run_with_artifacts(sdcloud_home, "r-0000bbbb")
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "README.md").write_text("my own notes\n")
    before = _listing(mine)
    capsys.readouterr()
    assert main(["pull", "r-0000aaaa", str(mine)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not empty" in err and "--force" in err
    assert _listing(mine) == before, "nothing written"

    got = tmp_path / "got"
    assert main(["pull", "r-0000aaaa", str(got)]) == 0  # a new folder
    assert main(["pull", "r-0000aaaa", str(got)]) == 0  # an earlier pull of the same run: refreshed
    capsys.readouterr()
    assert main(["pull", "r-0000bbbb", str(got)]) == 2  # another run's pull: not mixed in
    assert "not empty" in capsys.readouterr().err

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["pull", "r-0000aaaa", str(empty)]) == 0
    assert main(["pull", "r-0000aaaa", str(mine), "--force"]) == 0
    assert (mine / "README.md").read_text() == "# the run's readme\n"


def _finished_fake_job(tmp_path: Path, prompt: str) -> str:
    """A batch job of two fake images, generated in-process by one worker as a host runs it."""
    from tests.support.fake_batch import FakeGenerator
    from sdcloud_agent.batch.worker import Worker

    from sdcloud.batch.jobs import SubmitOptions, find_job, submit
    from sdcloud.runs.records.store import open_run_store

    prompts = tmp_path / f"{prompt.replace(' ', '-')}.txt"
    prompts.write_text(prompt + "\n")
    res = submit(SubmitOptions(tier="batch-sd15", model="tiny", prompts=str(prompts), images_per_prompt=2, workers=1,
                               provider="local", generator="fake"))
    spec = find_job(res["job"])["spec"]
    Worker(open_run_store(spec["store"]), spec["prefix"], FakeGenerator(), idle_wait=0.01).run()
    return res["job"]


def test_batch_pull_does_not_mix_two_jobs_in_one_folder(tmp_path, sdcloud_home, capsys):
    first, second = _finished_fake_job(tmp_path, "a red cube"), _finished_fake_job(tmp_path, "a blue ball")
    out = tmp_path / "pulled"
    assert main(["batch", "pull", first, str(out)]) == 0
    pulled = _listing(out)
    assert len([k for k in pulled if k.startswith("images/")]) == 2
    assert main(["batch", "pull", first, str(out)]) == 0  # the same job again: fine
    capsys.readouterr()
    assert main(["batch", "pull", second, str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not empty" in err and "--force" in err
    assert _listing(out) == pulled, "nothing of the second job written"
    assert main(["batch", "pull", second, str(out), "--force"]) == 0
    assert len(list((out / "images").glob("*.png"))) == 4
