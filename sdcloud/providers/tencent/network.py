"""The network of a Tencent host in mainland China: the defaults of its outside things.

Hosts in these regions reach PyPI, the Hugging Face hub and GitHub slowly or not at all, so they
get mirrors by default (runs/inputs/network.py layers config.toml's `[network]` and the run file over
them; docs/providers-tencent.md says what each default is and why). Every other region, Hong Kong
and Taipei included, uses the public services.
"""

from __future__ import annotations

from ..traits import NetworkProfile

# Tencent Cloud regions in mainland China (Tencent's "Regions and Availability Zones" list, as COS
# names them: Guangzhou, Shanghai, Nanjing, Beijing, Chengdu, Chongqing and the finance zones of
# Shanghai, Shenzhen and Beijing; the catalog's ap-guangzhou, ap-shanghai and ap-beijing rows).
# Hong Kong, Taipei and every region outside China are not in it.
MAINLAND_REGIONS = frozenset({
    "ap-guangzhou", "ap-shanghai", "ap-nanjing", "ap-beijing", "ap-chengdu", "ap-chongqing",
    "ap-shanghai-fsi", "ap-shenzhen-fsi", "ap-beijing-fsi",
})

# The mainland profile. Each is a default, overridable (runs/inputs/network.py):
# - pip_index_url: Tencent Cloud's own PyPI mirror (mirrors.cloud.tencent.com, its mirror site's
#   PyPI help page); over https it works from any network. Inside a Tencent VPC the same mirror is
#   also served as http://mirrors.tencentyun.com/pypi/simple (no public traffic; pip is then told
#   to trust the plain-http host);
# - hf_endpoint: hf-mirror.com, a community mirror of the Hugging Face hub that speaks the hub's
#   HTTP API (huggingface_hub reads HF_ENDPOINT); not run by Tencent nor by Hugging Face;
# - trainer_sources: "bucket": kohya's sd-scripts and the diffusers examples travel through the
#   run's bucket, put there by the control plane (sdcloud/runs/inputs/carry.py), never fetched from GitHub
#   by the host.
# torch's CUDA wheels keep download.pytorch.org (no mirror of its per-CUDA indexes was verified);
# the environment they are part of is cached in the bucket after the first boot.
MAINLAND = {
    "pip_index_url": "https://mirrors.cloud.tencent.com/pypi/simple",
    "hf_endpoint": "https://hf-mirror.com",
    "trainer_sources": "bucket",
}

PROFILES = (NetworkProfile("mainland", MAINLAND_REGIONS, MAINLAND),)
