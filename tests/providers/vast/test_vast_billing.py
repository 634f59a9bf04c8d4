"""`sdcloud cost reconcile` and `cost report` with Vast.ai's charges (GPU, storage, bandwidth per instance)
read from the fake's invoices beside the ledger."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from sdcloud.cli import main
from sdcloud.costs import ledger
from sdcloud.offers.catalog import bundled_rows
from sdcloud.offers.optimizer import Offer
from sdcloud.providers.base import LaunchSpec
from sdcloud.runs.records.state import StateStore


def test_reconcile_reads_the_instances_charges_beside_the_ledger(provider, fake, capsys):
    row = replace(next(r for r in bundled_rows("vast") if r.gpu == "RTX4090" and r.gpu_count == 1), zone="")
    of = Offer(row, "spot")
    inst = provider.launch(of, LaunchSpec("r-vbill", 1, user_data="echo"), "spot")
    provider.describe([inst.id])
    provider.describe([inst.id])  # running: its GPU time is charged from here
    time.sleep(0.05)
    fake.add_bytes(inst.id, up=3_000_000_000, down=8_000_000_000)
    provider.terminate([inst.id])
    state = StateStore()
    start, end = time.time() - 3600, time.time() - 60
    state.create_run("r-vbill", "sdxl-lora", {"tier": "sdxl-lora", "provider": "vast"}, 100)
    state.add_attempt("r-vbill", 1, "vast", "tok-vbill", region=row.region, zone="", instance_type=row.instance_type,
                      market="spot", price=of.price_per_hour_usd, currency="USD")
    state.update_attempt("r-vbill", 1, state="running", start=start, instance_id=inst.id)
    ledger.started(state, "r-vbill", 1, of, "spot", 60, zone="", at=start)
    state.update_attempt("r-vbill", 1, state="ended", end=end, end_reason="succeeded")
    ledger.closed(state, "r-vbill", 1)
    charged = sum(line["amount"] for line in fake._invoices(time.time()) if line["instance_id"] == int(inst.id))
    assert charged > 8 * 0.003  # the bytes alone
    capsys.readouterr()
    assert main(["cost", "reconcile", "--since", "30d", "--json"]) == 0
    (rec,) = [r for r in json.loads(capsys.readouterr().out) if r["run"] == "r-vbill"]
    assert rec["billed_usd"] == pytest.approx(charged, abs=1e-4) and rec["estimate_usd"] > 0
    assert state.billed("r-vbill")[0]["currency"] == "USD"
    assert any(p.startswith("/users/me/invoices") for _, p, _, _ in fake.log)
    assert main(["cost", "report", "r-vbill", "--format", "json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["total_source"] == "billed" and run["billed_usd"] == pytest.approx(charged, abs=1e-4)
