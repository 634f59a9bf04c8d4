"""The event registry (sdcloud/events.py): every kind has its fields, old spellings read back as
today's kinds, and every kind is recorded somewhere (a kind nobody records is a dead word)."""

from __future__ import annotations

import ast

from sdcloud import events
from sdcloud.events import ALIASES, FIELDS, Kind

from tests.support import ROOT



def test_every_kind_has_its_fields_and_a_hyphenated_value():
    assert set(FIELDS) == set(Kind)
    for kind in Kind:
        assert kind.value == kind.value.lower() and "_" not in kind.value and "." not in kind.value, kind
        f = FIELDS[kind]
        assert not set(f.required) & set(f.optional), kind


def test_old_spellings_read_back_as_todays_kinds():
    for old, new in ALIASES.items():
        assert old not in {k.value for k in Kind}, f"{old} is an alias and a kind"
        assert events.parse(old) is new
    assert events.parse("launch_failed") is Kind.LAUNCH_FAILED
    assert events.parse("budget") is Kind.BUDGET_REACHED
    assert events.parse("launched") is Kind.LAUNCHED
    # A kind written by a newer sdcloud stays readable, as the string it is.
    assert events.parse("some-future-kind") == "some-future-kind"
    assert events.run_ended("failed") is Kind.RUN_FAILED and events.batch_ended("stopped") is Kind.BATCH_STOPPED


def test_a_kind_stores_and_compares_as_its_value():
    import json

    assert json.loads(json.dumps({"kind": Kind.HOST_LOST}))["kind"] == "host-lost"
    assert Kind.HOST_LOST == "host-lost" and Kind.HOST_LOST in events.HOST_GONE


def _kinds_named_in(paths) -> set[str]:
    named = set()
    for path in paths:
        for n in ast.walk(ast.parse(path.read_text())):
            base = n.value if isinstance(n, ast.Attribute) else None
            if (isinstance(base, ast.Name) and base.id == "Kind") or (isinstance(base, ast.Attribute) and base.attr == "Kind"):
                named.add(n.attr)
    return named


def test_every_kind_is_recorded_somewhere():
    code = [p for p in (ROOT / "sdcloud").rglob("*.py") if p.name != "events.py"]
    named = _kinds_named_in(code)
    # Kinds recorded through a helper that builds them from a state (run_ended, batch_ended).
    built = {k.name for k in events.RUN_ENDED | events.BATCH_ENDED}
    dead = {k.name for k in Kind} - named - built
    assert not dead, f"kinds nobody records (remove them or record them): {sorted(dead)}"


def test_a_reclaim_notice_says_when_the_host_is_taken_back_on_this_machines_clock(monkeypatch):
    # The lines are stamped with this machine's clock time; the time the cloud takes the host back is
    # said the same way, to the second, not as the cloud's ISO string in UTC.
    import time

    monkeypatch.setenv("TZ", "Asia/Shanghai")
    time.tzset()
    try:
        said = events.words(Kind.RECLAIM_NOTICE, {"instance": "i-1", "terminate_at": "2026-12-03T06:41:43.727042+00:00",
                                                  "simulated": True})
        assert said == "reclaim-notice for host i-1: taken back at 14:41:43 (simulated); the host saves and stops"
        assert events.words(Kind.RECLAIM_NOTICE, {"instance": "i-1"}) == "reclaim-notice for host i-1; the host saves and stops"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_inputs_staged_without_a_dataset_says_so_instead_of_none():
    said = events.words(Kind.INPUTS_STAGED, {"dataset": None, "model": "tiny", "settings": {"hosts": {}},
                                             "effective": {}, "staged_on": "box:/home/u/.sdcloud"})
    assert said == "inputs staged on box:/home/u/.sdcloud: no dataset, model tiny, settings [hosts]"
    said = events.words(Kind.INPUTS_STAGED, {"dataset": "s3://b/p/datasets/ab12", "model": "tiny", "settings": {},
                                             "effective": {"network_profile": "mainland"}, "staged_on": "box:/h"})
    assert said == ("inputs staged on box:/h: dataset s3://b/p/datasets/ab12, model tiny, settings [none], "
                    "network profile mainland")
