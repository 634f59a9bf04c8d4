"""Every event kind has words (issue 39: `logs` showed `host-started`, `inputs-staged` and others by
their raw kind): each is told from its fields, with every optional field or none of them, and the
live view (`up`, `watch`) leaves the routine ones to -v while `logs` tells them."""

from __future__ import annotations

import pytest

from sdcloud import events
from sdcloud.events import FIELDS, ROUTINE, WORDS, Kind
from sdcloud.runs.driving import health_view
from sdcloud.verbs.progress_view import plain

# A value of the shape the code that records each field writes.
SAMPLE = {"attempt": 2, "step": 120, "total": 400, "from_step": 100, "lost_steps": 20, "it_per_s": 1.7, "pct": 80,
          "budget": 5.0, "spent": 4.0, "budget_usd": 5.0, "cost_usd": 5.01, "failed_launches": 3, "files": 12,
          "sent": 12, "mb": 3.5, "seconds": 1.2, "price_usd": 0.52, "price": 3.1, "max_price": 0.4,
          "current_price": 0.6, "wait_s": 2, "pid": 4242, "rc": 0, "items": 8, "images": 32, "workers": 2, "slot": 0,
          "n": 2, "instances": ["i-0abc"], "settings": {"hosts": {}, "network": {}},
          "effective": {"network_profile": "global", "network": {}}, "offer": "aws/us-east-1/us-east-1a/g5.xlarge/spot",
          "changes": {"batch_size": 1}, "unattended": True, "simulated": True, "adopted": True, "cached": False,
          "reported": True, "moved": False, "still": False, "trainer_sources": "runs/r/sources.tar", "action": "adopted-orphan"}


def _sample(fields: tuple[str, ...]) -> dict:
    return {f: SAMPLE.get(f, f"<{f}>") for f in fields}


def test_every_kind_has_words():
    told_elsewhere = set(health_view.KINDS)  # the health figures' words are health_view's
    assert {k for k in Kind if k not in WORDS and k not in told_elsewhere} == set()


@pytest.mark.parametrize("kind", [k for k in Kind if k in FIELDS and k not in health_view.KINDS], ids=str)
def test_each_kind_is_told_in_words_from_its_fields(kind):
    f = FIELDS[kind]
    text = plain(kind, _sample(f.required + f.optional))
    assert text and text != kind.value and "None" not in text, (kind, text)
    assert not text.startswith(f"{kind.value}: "), text  # words, not the `kind: key=value` form
    # With only the fields every event of the kind carries, it is still told (and nothing raises).
    assert plain(kind, _sample(f.required))


def test_logs_tell_controller_events_in_words_and_keep_the_reclaim_notice_name(sdcloud_home, tmp_path):
    from sdcloud.verbs.logs import log_records
    from sdcloud.runs.records.state import StateStore

    state = StateStore()
    (tmp_path / "b").mkdir()
    state.create_run("b-words01", "batch-sd15", {"kind": "batch", "provider": "local",
                                                 "store": {"url": (tmp_path / "b").as_uri()}}, total_steps=8)
    run = state.get_run("b-words01")
    for kind in (Kind.HOST_STARTED, Kind.INPUTS_STAGED, Kind.RECLAIM_NOTICE, Kind.PROGRESS):
        f = FIELDS[kind]
        state.event(run["id"], kind, _sample(f.required + f.optional))
    recs = [r for r in log_records(state, run, {}) if r["source"] == "controller"]
    assert [r["kind"] for r in recs] == ["host-started", "inputs-staged", "reclaim-notice", "progress"]
    for r, ev in zip(recs, state.events(run["id"])):
        assert r["text"] != r["kind"] and r["text"] == plain(ev["kind"], ev["data"])
    assert recs[2]["text"].startswith("reclaim-notice for host <instance>")


def test_the_live_view_leaves_routine_kinds_to_verbose(capsys, monkeypatch):
    from sdcloud import render
    from sdcloud.verbs.progress_view import ProgressView

    monkeypatch.setattr(render, "VERBOSITY", 0)
    view = ProgressView(total=40, quiet=False, clock=lambda: 0.0)
    for kind in (Kind.INPUTS_STAGED, Kind.RECLAIM_NOTICE, Kind.RETRY):
        f = FIELDS[kind]
        view(kind, _sample(f.required), at=0.0)
    err = capsys.readouterr().err
    assert "reclaim-notice for host" in err and "inputs staged" not in err and "retried" not in err
    assert Kind.RECLAIM_NOTICE not in ROUTINE and events.words(Kind.RETRY, _sample(("call",)))


@pytest.mark.parametrize("kind", health_view.KINDS, ids=str)
def test_health_kinds_are_told_without_missing_figures_as_none(kind):
    # An older host reports fewer figures: what it did not report is left out of the words, not
    # printed as "None".
    f = FIELDS[kind]
    values = {"attempt": 2, "n": 1, "cause": "io-bound", "changes": [], "still": True, "offer": "g5.xlarge",
              "moved": False, "why": "the restart costs more than it saves", "verdict": "healthy"}
    text = plain(kind, {k: values.get(k, f"<{k}>") for k in f.required})
    assert text and "None" not in text and text.startswith("attempt 2: "), (kind, text)
    full = plain(kind, {**{k: values.get(k, 1) for k in f.required + f.optional},
                        "changes": ["2 more loader workers"], "reasons": ["sw_power_cap"], "next": ["g5.2xlarge"],
                        "before": {}, "after": {}})
    assert full and "None" not in full, (kind, full)
