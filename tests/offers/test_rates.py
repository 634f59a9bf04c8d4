"""The catalog's rates: the training model (per-step overhead, batch size) against the measured and
published figures it is calibrated on, and every offer's rate with its source."""

from __future__ import annotations

import json

import pytest

from sdcloud.cli import main
from sdcloud.offers.catalog import load_catalog
from sdcloud.offers.gpus import gpu_table
from sdcloud.offers.optimizer import SETUP_HOURS, rank
from sdcloud.offers.rates import (FIGURE_BASES, catalog_rate, catalog_source, figure_gpu, gpu_rate, overhead_share,
                                  rate_data)
from sdcloud.offers.tiers import all_tiers, get_tier

# The acceptance ranges for one H100 (steps/s; images/s for batch tiers).
H100_RANGES = {"sdxl-lora": (1.5, 3.2), "sd15-lora": (3.5, 8.0), "sdxl-dreambooth": (0.7, 1.7),
               "batch-sdxl": (0.45, 0.95)}


def _offers_json(capsys, *args) -> list[dict]:
    assert main(["offers", *args, "--json", "--limit", "0"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("tier, bounds", list(H100_RANGES.items()))
def test_one_h100_rate_is_in_the_measured_range(tier, bounds):
    value = gpu_rate(get_tier(tier), "H100")
    assert bounds[0] <= value <= bounds[1], (tier, value)


def test_training_is_no_longer_inference_scaled_on_large_gpus():
    # Inference scaling gave sdxl-lora 5.32 steps/s on an H100 (0.8 x 6.646): the model is less than half of it.
    t = get_tier("sdxl-lora")
    assert gpu_rate(t, "H100") < 0.5 * t.ref_rate * gpu_table()["H100"].infer_rel
    # ... while on the reference GPU it is the tier's own reference rate.
    assert gpu_rate(t, "A10G") == pytest.approx(t.ref_rate)


def test_each_calibrated_tier_gives_its_figure_exactly():
    data = rate_data()
    for tier_name, model in data["model"].items():
        if "calibrate" not in model:
            continue
        fig = data["figures"][model["calibrate"]]
        assert fig["tier"] == tier_name
        assert gpu_rate(get_tier(tier_name), figure_gpu(fig)) == pytest.approx(fig["rate"], rel=1e-6)


def test_published_figures_are_within_the_stated_tolerance():
    data = rate_data()
    tol = float(data["published_tolerance"])
    checked = 0
    for fig in data["figures"].values():
        if fig["basis"] != "published":
            continue
        got = gpu_rate(get_tier(fig["tier"]), figure_gpu(fig))
        assert abs(got / fig["rate"] - 1) <= tol, (fig, got)
        checked += 1
    assert checked >= 2


def test_the_l40s_is_no_longer_2_6_times_slower_than_an_h100_at_sdxl_lora_batch_1():
    # SimpleTuner: 0.606 s/step on an H100, 0.585 on an L40S. Inference scaling made the H100 2.6x faster.
    t = get_tier("sdxl-lora")
    ratio = gpu_rate(t, "H100") / gpu_rate(t, "L40S")
    assert ratio < 1.8
    assert gpu_table()["H100"].infer_rel / gpu_table()["L40S"].infer_rel > 2.5


def test_every_figure_says_its_basis():
    for name, fig in rate_data()["figures"].items():
        assert fig["basis"] in FIGURE_BASES, name
        assert figure_gpu(fig) in gpu_table(), name
        assert fig["tier"] in all_tiers() and fig["rate"] > 0, name
        if fig["basis"] == "measured":
            assert fig["gpu"] and fig["date"] and fig["commit"] and fig["what"], name
        else:
            assert fig["source"], name


def test_every_training_tier_has_a_model_and_every_share_is_a_share():
    tiers = all_tiers()
    for t in tiers.values():
        share, source = overhead_share(t.name)
        if t.kind == "batch":
            assert share == 0.0
            continue
        assert t.name in rate_data()["model"], t.name
        assert 0.05 < share < 0.6, (t.name, share)
        assert source in rate_data()["figures"]


def test_a_tier_without_a_figure_borrows_the_share_of_its_like():
    assert overhead_share("sdxl-finetune")[0] == overhead_share("sdxl-dreambooth")[0]
    assert "(as sdxl-dreambooth)" in catalog_source(get_tier("sdxl-finetune"), "L40S")


def test_batch_size_grows_the_compute_part_only():
    t = get_tier("sdxl-lora")
    one, two = 1 / gpu_rate(t, "H100", 1), 1 / gpu_rate(t, "H100", 2)
    share = overhead_share("sdxl-lora")[0]
    # The step time grows by the compute part, not doubled: the overhead stays.
    assert one < two < 2 * one
    assert two - one == pytest.approx((1 / t.ref_rate) * (1 - share) / gpu_table()["H100"].infer_rel)


def test_batch_tiers_scale_with_inference():
    t = get_tier("batch-sdxl")
    for gpu, perf in gpu_table().items():
        assert gpu_rate(t, gpu) == pytest.approx(t.ref_rate * perf.infer_rel)
    assert catalog_source(t, "H100").startswith("inference: ")


def test_an_unknown_gpu_has_no_rate():
    assert gpu_rate(get_tier("sdxl-lora"), "B200") is None
    assert catalog_rate(get_tier("sdxl-lora"), "B200") is None


def test_a_multi_gpu_host_rate_is_the_speed_up_of_one():
    t = get_tier("sdxl-lora")
    assert catalog_rate(t, "A10G", 4).value == pytest.approx(gpu_rate(t, "A10G") * 4 * 0.9 ** 2)


def test_every_offer_row_carries_rate_and_source(capsys, sdcloud_home):
    for tier in ("sdxl-lora", "batch-sd15"):
        rows = _offers_json(capsys, "--tier", tier)
        assert rows
        for r in rows:
            assert r["rate"] > 0 and r["rate_source"], r
            assert r["rate_unit"] == ("steps/s" if tier == "sdxl-lora" else "images/s")
            # est h follows from the rate (before the spot overhead).
            job = get_tier(tier).job_size
            assert r["est_hours"] == pytest.approx((SETUP_HOURS + job / r["rate"] / 3600) * r["overhead"], abs=2e-3)


def test_single_h100_offers_have_the_models_rate(capsys, sdcloud_home):
    rows = [r for r in _offers_json(capsys, "--tier", "sdxl-lora") if r["gpu"] == "H100"]
    assert rows
    low, high = H100_RANGES["sdxl-lora"]
    for r in rows:
        per_gpu = r["rate"] / (1 if r["gpu_count"] == 1 else r["gpu_count"] * 0.9 ** (r["gpu_count"].bit_length() - 1))
        assert low <= per_gpu <= high and per_gpu == pytest.approx(gpu_rate(get_tier("sdxl-lora"), "H100"), rel=1e-3)
        assert r["rate_source"].startswith("model: ") and "h200-builtin-sdxl-lora" in r["rate_source"]


def test_explain_shows_rate_and_its_source(capsys, sdcloud_home, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["offers", "--tier", "sdxl-lora", "--provider", "aws", "--limit", "3", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "rate source" in out and "steps/s" in out and "step overhead from" in out


def test_ranking_on_the_catalog_follows_the_rate():
    ranked = rank(get_tier("sdxl-dreambooth"), load_catalog(["aws"]), market="on-demand")
    for e in ranked:
        assert e.rate is not None and e.rate.origin == "catalog"
        assert e.est_cost == pytest.approx(e.offer.price_per_hour_usd * e.est_hours)
