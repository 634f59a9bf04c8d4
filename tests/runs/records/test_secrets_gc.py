"""`sdcloud gc` deletes a secret an ended run left in its bucket (its end could not reach the store),
and none of a run that is still going (runs/inputs/hub_access.py: a secret lives as long as its run)."""

from __future__ import annotations

from sdcloud.cli import main
from sdcloud.runs.records.state import StateStore
from sdcloud_agent.store import LocalStore


def test_gc_deletes_the_secrets_ended_runs_left_and_keeps_a_live_runs(tmp_path, sdcloud_home, capsys):
    bucket = tmp_path / "bucket"
    store = LocalStore(bucket)
    state = StateStore()
    for rid, end in (("r-ended001", "failed"), ("r-ended002", "succeeded"), ("r-live0001", "running")):
        state.create_run(rid, "sd15-lora", {"tier": "sd15-lora", "provider": "local", "model": "tiny",
                                            "store": bucket.as_uri()}, 10)
        state.update_run(rid, state=end)
        store.put(f"runs/{rid}/secrets/hf-token", b"hf_left0000000000000000000000000")
        store.put(f"runs/{rid}/checkpoints/step-1/manifest.json", b"{}")
    assert main(["gc", "--provider", "local", "--yes"]) in (0, None)
    assert "deleted the secrets 2 ended run(s) had left" in capsys.readouterr().err
    assert store.list("runs/r-ended001/secrets/") == [] and store.list("runs/r-ended002/secrets/") == []
    assert [o.key for o in store.list("runs/r-live0001/secrets/")] == ["runs/r-live0001/secrets/hf-token"]
    assert store.head("runs/r-ended001/checkpoints/step-1/manifest.json") is not None, "only the secrets go"
