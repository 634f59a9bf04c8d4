"""A hub model is fetched by what training needs: the pipeline's components in safetensors, one
precision, nothing else. Against a local hub (tests/support/fake_hub.py) reached through HF_ENDPOINT,
holding a repository shaped like SDXL base with all its extra copies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile


from sdcloud_agent.trainers.models import hub_selection

from tests.support.fake_hub import MODEL_INDEX, SDXL_BASE, FakeHub, sdxl_shaped

REPO = "stabilityai/stable-diffusion-xl-base-1.0"
COMPONENTS = [k for k, v in MODEL_INDEX.items() if isinstance(v, list) and v[0]]
NEEDED = {
    "model_index.json", "scheduler/scheduler_config.json",
    *(f"{t}/{n}" for t in ("tokenizer", "tokenizer_2")
      for n in ("merges.txt", "special_tokens_map.json", "tokenizer_config.json", "vocab.json")),
    "text_encoder/config.json", "text_encoder/model.safetensors",
    "text_encoder_2/config.json", "text_encoder_2/model.safetensors",
    "unet/config.json", "unet/diffusion_pytorch_model.safetensors",
    "vae/config.json", "vae/diffusion_pytorch_model.safetensors",
}


def test_the_selection_is_the_pipelines_components_in_one_precision():
    wanted, renames = hub_selection(list(SDXL_BASE), COMPONENTS)
    assert set(wanted) == NEEDED and len(wanted) == len(NEEDED) and renames == {}
    needed = sum(SDXL_BASE[f] for f in NEEDED)
    whole = sum(SDXL_BASE.values())
    # About 13.9 GB of about 70 GB: the fp32 weights of unet, both text encoders and the VAE.
    assert 13.5e9 < needed < 14.5e9 and whole > 65e9


def test_a_component_with_only_a_variant_takes_it_under_the_plain_name():
    files = ["model_index.json", "unet/config.json", "unet/diffusion_pytorch_model.fp16.safetensors",
             "unet/diffusion_pytorch_model.bf16.safetensors", "unet/diffusion_flax_model.msgpack",
             "vae/config.json", "vae/diffusion_pytorch_model-00001-of-00002.safetensors",
             "vae/diffusion_pytorch_model-00002-of-00002.safetensors", "vae/diffusion_pytorch_model.safetensors.index.json",
             "vae/diffusion_pytorch_model.bin"]
    wanted, renames = hub_selection(files, ["unet", "vae"])
    assert sorted(wanted) == sorted(["model_index.json", "unet/config.json", "unet/diffusion_pytorch_model.fp16.safetensors",
                                     "vae/config.json", "vae/diffusion_pytorch_model.safetensors.index.json",
                                     "vae/diffusion_pytorch_model-00001-of-00002.safetensors",
                                     "vae/diffusion_pytorch_model-00002-of-00002.safetensors"])
    assert renames == {"unet/diffusion_pytorch_model.fp16.safetensors": "unet/diffusion_pytorch_model.safetensors"}


def test_a_repo_of_one_component_is_its_top_level():
    files = ["config.json", "diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin", "README.md"]
    assert hub_selection(files, None)[0] == ["config.json", "diffusion_pytorch_model.safetensors"]


STAGE = """
import json, sys
from pathlib import Path
from sdcloud_agent import models
from sdcloud_agent.store import LocalStore
path, how = models.stage(sys.argv[1], LocalStore(sys.argv[2]), Path(sys.argv[3]))
print(json.dumps({"path": path, "how": how}))
"""


def _stage(hub: FakeHub, tmp_path, root: str) -> dict:
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "0",
           "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    p = subprocess.run([sys.executable, "-c", STAGE, REPO, str(tmp_path / "bucket"), str(tmp_path / root)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_cold_boot_fetches_only_what_training_needs_and_caches_only_that(tmp_path):
    repo = sdxl_shaped(scale=10_000)
    with FakeHub({REPO: repo}) as hub:
        got = _stage(hub, tmp_path, "host1")
        assert got["how"] == "fetched"
        fetched = {k.removeprefix(REPO + "/") for k in hub.fetched}
        assert fetched == NEEDED, sorted(fetched ^ NEEDED)
        need_bytes = sum(len(repo[f]) for f in NEEDED)
        assert hub.bytes_fetched() == need_bytes  # each file once
        whole = sum(len(d) for d in repo.values())
        print(f"\nfake SDXL base (1/10000 scale): fetched {need_bytes} of {whole} bytes ({need_bytes / whole:.1%})")
        # The tar in the bucket holds those files and nothing else (no hub bookkeeping).
        [tar] = list((tmp_path / "bucket" / "cache" / "models").glob("hub-*.tar"))
        with tarfile.open(tar) as tf:
            inside = {m.name.removeprefix("./") for m in tf.getmembers() if m.isfile()}
        assert inside == NEEDED
        # The next host restores it from the bucket: nothing more from the hub.
        assert _stage(hub, tmp_path, "host2")["how"] == "restored"
        assert hub.bytes_fetched() == need_bytes
