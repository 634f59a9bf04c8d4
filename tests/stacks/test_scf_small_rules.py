"""Rules from Tencent's documents the SCF stack keeps (stacks/tencent/scf_policy.py, readable without
Pulumi): the function's role may do every COS action the store's calls need, a copy included, and
the function's code object has a key SCF and COS read the same way."""

from __future__ import annotations

import json

from tests.support.harness_stacks import stack_module


def _granted_on_prefix(policy: dict, prefix: str) -> set[str]:
    return {a for st in policy["statement"] for a in st["action"]
            if any(r.endswith(f"/{prefix}/*") for r in st["resource"])}


def test_the_function_role_may_copy_objects_under_its_prefix():
    scf = stack_module("tencent", "scf_policy")
    doc = json.loads(scf.function_policy_document("ap-guangzhou", "1250000000", "sd-1250000000", "sdcloud", "100001",
                                                  "sdcloud-host", ("sdcloud:stack", "test")))
    granted = _granted_on_prefix(doc, "sdcloud")
    assert "name/cos:PutObjectCopy" in granted, granted
    object_calls = [c for c in scf.STORE_CALLS if c not in ("ListObjectsV2", "DeleteObjects")]
    for call in object_calls:  # every object action a store call needs is granted on the prefix
        assert set(scf.STORE_CALLS[call]) <= granted, (call, scf.STORE_CALLS[call])


def test_the_code_objects_key_has_no_plus():
    from sdcloud.infra.function_package import BASE_VERSION

    scf = stack_module("tencent", "scf_policy")
    name = f"sdcloud-driver-{BASE_VERSION}+0123456789ab.zip"
    key = scf.code_key(name)
    assert "+" not in key and key.startswith(f"{scf.CODE_FOLDER}/") and key.endswith("0123456789ab.zip"), key
    assert scf.code_key(name) != scf.code_key(name.replace("0123456789ab", "ba9876543210")), "each version its own"


def test_the_simpletuner_figures_say_what_they_were_measured_on():
    import tomllib
    from importlib import resources

    figures = tomllib.loads(resources.files("sdcloud.data").joinpath("train_rates.toml").read_text())["figures"]
    simpletuner = {k: v for k, v in figures.items() if "simpletuner" in k}
    assert simpletuner
    for name, fig in simpletuner.items():
        assert "LoKr" in fig["source"] and "cached latents" in fig["source"], name
