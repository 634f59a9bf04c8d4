"""RunKind: the one answer to "is this a batch job?", for tiers, run rows, specs and summaries."""

from __future__ import annotations

import json

import pytest

from sdcloud.offers.kinds import RunKind
from sdcloud.offers.tiers import all_tiers


def test_every_tier_declares_a_kind_member_and_its_unit_follows():
    tiers = all_tiers()
    assert {t.kind for t in tiers.values()} == {RunKind.TRAIN, RunKind.BATCH}
    for t in tiers.values():
        assert isinstance(t.kind, RunKind)
        assert t.unit == ("images" if t.kind is RunKind.BATCH else "steps")
        # Stored and shown as the plain word: old readers and --json consumers see what they saw.
        assert json.loads(json.dumps(t.as_dict()))["kind"] in ("train", "batch")


@pytest.mark.parametrize("record, kind", [
    ({"spec": {"kind": "batch", "tier": "batch-sd15"}}, RunKind.BATCH),  # a run row: its spec says
    ({"kind": "batch", "tier": "batch-sd15"}, RunKind.BATCH),  # a spec, or a summary
    ({"kind": "train"}, RunKind.TRAIN),
    ({"spec": {"tier": "sd15-lora"}}, RunKind.TRAIN),  # a row from before batch jobs existed
    ({"spec": "not a dict"}, RunKind.TRAIN),  # a row of another shape is never taken for a job
    ({}, RunKind.TRAIN),
    (None, RunKind.TRAIN),
    ({"kind": "something newer"}, RunKind.TRAIN),
])
def test_the_kind_of_a_row_a_spec_or_a_summary(record, kind):
    assert RunKind.of(record) is kind


def test_a_tier_of_another_kind_is_refused_when_the_tiers_load(tmp_path, monkeypatch):
    from sdcloud.offers import tiers as tiers_mod

    with pytest.raises(ValueError, match="kind must be train or batch"):
        tiers_mod._tier("odd", {"kind": "render", "description": "", "min_vram_gb": 1, "rec_vram_gb": 1,
                                "gpu_count": 1, "vcpus": 1, "memory_gb": 1, "nvme_gb": 1, "steps": 1,
                                "resolution": 512, "batch_size": 1, "ref_rate": 1.0})


def test_the_runs_table_answers_with_the_member(tmp_path):
    from sdcloud.runs.records.state import StateStore, run_kind

    state = StateStore(tmp_path / "state.db")
    state.create_run("r-1", "sd15-lora", {"tier": "sd15-lora"}, 10)
    state.create_run("j-1", "batch-sd15", {"kind": "batch", "tier": "batch-sd15"}, 10)
    kinds = {r["id"]: run_kind(r) for r in state.list_runs()}
    assert kinds == {"r-1": RunKind.TRAIN, "j-1": RunKind.BATCH}
