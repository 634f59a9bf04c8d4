"""The Stable Diffusion 3.5 tiers (family sd3): their figures, sources and the offers that meet them."""

from __future__ import annotations

import json

import pytest

from sdcloud.cli import main
from sdcloud.offers.gpus import gpu_table
from sdcloud.offers.tiers import all_tiers, get_tier

SD3_TIERS = ("sd35m-lora", "sd35l-lora", "sd35m-dreambooth", "batch-sd35")


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_sd3_tiers_name_their_family_floors_and_sources(capsys):
    code, out, _ = run_cli(capsys, "tiers", "--json")
    assert code == 0
    tiers = {t["name"]: t for t in json.loads(out)}
    for name in SD3_TIERS:
        t = tiers[name]
        assert t["family"] == "sd3" and t["base_model"].startswith("stabilityai/stable-diffusion-3.5-")
        assert 0 < t["min_vram_gb"] <= t["rec_vram_gb"] and t["memory_gb"] > 0 and t["nvme_gb"] > 0
        for key in ("base_model", "min_vram_gb", "rec_vram_gb", "memory_gb", "vcpus", "nvme_gb", "ref_rate"):
            assert t["sources"].get(key), f"{name}: no source for {key}"
    # SD3.5 Large's 8B transformer needs more than Medium's 2.5B; a T4 (15.0 GiB usable) fits none.
    assert tiers["sd35l-lora"]["min_vram_gb"] > tiers["sd35m-lora"]["min_vram_gb"]
    assert all("T4" not in tiers[n]["gpus_fit"] for n in SD3_TIERS)
    assert get_tier("sd35m-dreambooth").mode == "dreambooth" and get_tier("sd35l-lora").mode == "lora"
    assert tiers["batch-sd35"]["images"] > 0 and tiers["sd35m-lora"]["steps"] > 0


def test_offers_for_sd35_large_meet_its_floor(capsys):
    floor = get_tier("sd35l-lora").min_vram_gb
    code, out, err = run_cli(capsys, "offers", "--tier", "sd35l-lora", "--spot", "--json", "--limit", "0")
    assert code == 0, err
    rows = json.loads(out)
    assert rows and all(r["vram_gb"] >= floor and r["market"] == "spot" for r in rows)
    costs = [r["est_cost"] for r in rows]
    assert costs == sorted(costs)
    # The floor is compared with what the driver reports: the 24 GB-class and V100-32GB cards are out.
    usable = {g.gpu: g.usable_gb for g in gpu_table().values()}
    assert {r["gpu"] for r in rows}.isdisjoint({g for g, u in usable.items() if u < floor})
    assert not {"A10G", "L4", "V100-32GB", "T4"} & {r["gpu"] for r in rows}
    # ...while the Medium LoRA tier takes the 24 GB-class cards the Large one refuses.
    _, out, _ = run_cli(capsys, "offers", "--tier", "sd35m-lora", "--spot", "--json", "--limit", "0")
    assert {"A10G", "L4"} & {r["gpu"] for r in json.loads(out)}


@pytest.mark.parametrize("name", SD3_TIERS)
def test_every_sd3_tier_is_ranked(name):
    from sdcloud.offers.catalog import load_catalog
    from sdcloud.offers.optimizer import rank

    tier = all_tiers()[name]
    ranked = rank(tier, load_catalog(), market="on-demand")
    assert ranked and all(e.offer.row.memory_gb >= tier.memory_gb for e in ranked)
    assert [e.est_cost for e in ranked] == sorted(e.est_cost for e in ranked)
