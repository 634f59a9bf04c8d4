"""A local Hugging Face hub: the HTTP API huggingface_hub speaks, for repositories held in memory.

A client reaches it through the hub endpoint setting (`HF_ENDPOINT=<hub.endpoint>`), as a host
reaches a mirror. Served: model info (`/api/models/<repo>[/revision/<rev>]`, with siblings), the
tree listing (`/api/models/<repo>/tree/<rev>[/<path>]`) and file downloads
(`HEAD`/`GET /<repo>/resolve/<rev>/<path>`, with X-Repo-Commit, ETag and Content-Length). Plain
HTTP, no Xet: the client takes its HTTP download path. `hub.fetched` counts the bytes each file's
GETs sent, which is what a cold boot downloads.

`sdxl_shaped(scale)` is a repository laid out like stabilityai/stable-diffusion-xl-base-1.0: the
pipeline's components in fp32 safetensors plus their fp16, flax, onnx and openvino copies, the
extra VAE folders and the top-level single-file checkpoints. The sizes are the published files'
approximate sizes divided by `scale`, so that shares of the whole are as on the hub.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler
from urllib.parse import unquote, urlsplit

from tests.support.server_http import LoopbackServer

GB, MB = 10**9, 10**6
SHA = "a" * 40  # the repository's one commit
REPO_SDXL = "stabilityai/stable-diffusion-xl-base-1.0"

# Approximate sizes of stabilityai/stable-diffusion-xl-base-1.0's files as listed on its hub page.
SDXL_BASE: dict[str, int] = {
    "model_index.json": 609,
    "scheduler/scheduler_config.json": 479,
    "tokenizer/merges.txt": 525_000, "tokenizer/special_tokens_map.json": 472,
    "tokenizer/tokenizer_config.json": 737, "tokenizer/vocab.json": 1_060_000,
    "tokenizer_2/merges.txt": 525_000, "tokenizer_2/special_tokens_map.json": 460,
    "tokenizer_2/tokenizer_config.json": 725, "tokenizer_2/vocab.json": 1_060_000,
    "text_encoder/config.json": 565, "text_encoder/model.safetensors": 492 * MB,
    "text_encoder/model.fp16.safetensors": 246 * MB, "text_encoder/flax_model.msgpack": 492 * MB,
    "text_encoder/model.onnx": 492 * MB, "text_encoder/openvino_model.bin": 246 * MB,
    "text_encoder/openvino_model.xml": 1 * MB,
    "text_encoder_2/config.json": 575, "text_encoder_2/model.safetensors": 2_780 * MB,
    "text_encoder_2/model.fp16.safetensors": 1_390 * MB, "text_encoder_2/flax_model.msgpack": 2_780 * MB,
    "text_encoder_2/model.onnx": 1 * MB, "text_encoder_2/model.onnx_data": 2_780 * MB,
    "text_encoder_2/openvino_model.bin": 1_390 * MB, "text_encoder_2/openvino_model.xml": 2 * MB,
    "unet/config.json": 1_680, "unet/diffusion_pytorch_model.safetensors": 10_270 * MB,
    "unet/diffusion_pytorch_model.fp16.safetensors": 5_140 * MB, "unet/diffusion_flax_model.msgpack": 10_270 * MB,
    "unet/model.onnx": 7 * MB, "unet/model.onnx_data": 10_270 * MB,
    "unet/openvino_model.bin": 5_140 * MB, "unet/openvino_model.xml": 9 * MB,
    "vae/config.json": 642, "vae/diffusion_pytorch_model.safetensors": 335 * MB,
    "vae/diffusion_pytorch_model.fp16.safetensors": 167 * MB, "vae/diffusion_flax_model.msgpack": 335 * MB,
    "vae_1_0/config.json": 607, "vae_1_0/diffusion_pytorch_model.safetensors": 335 * MB,
    "vae_1_0/diffusion_pytorch_model.fp16.safetensors": 167 * MB,
    "vae_decoder/config.json": 607, "vae_decoder/model.onnx": 198 * MB,
    "vae_encoder/config.json": 607, "vae_encoder/model.onnx": 137 * MB,
    "sd_xl_base_1.0.safetensors": 6_940 * MB, "sd_xl_base_1.0_0.9vae.safetensors": 6_940 * MB,
    "sd_xl_offset_example-lora_1.0.safetensors": 50 * MB,
    "README.md": 9_000, "01.png": 4_600_000, "LICENSE.md": 14_000,
}

MODEL_INDEX = {"_class_name": "StableDiffusionXLPipeline", "_diffusers_version": "0.19.0.dev0",
               "force_zeros_for_empty_prompt": True, "add_watermarker": None,
               "scheduler": ["diffusers", "EulerDiscreteScheduler"],
               "text_encoder": ["transformers", "CLIPTextModel"],
               "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
               "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "CLIPTokenizer"],
               "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"]}


def sdxl_shaped(scale: int = 10_000) -> dict[str, bytes]:
    """The SDXL-base-shaped repository's files, each `size // scale` bytes (configs as they are)."""
    out: dict[str, bytes] = {}
    for path, size in SDXL_BASE.items():
        if path == "model_index.json":
            out[path] = json.dumps(MODEL_INDEX).encode()
        elif path.endswith(".json"):
            out[path] = json.dumps({"name": path, "pad": "x" * max(0, size // scale - 40)}).encode()
        else:
            n = max(1, size // scale)
            seed = hashlib.sha256(path.encode()).digest()
            out[path] = (seed * (n // len(seed) + 1))[:n]
    return out


class FakeHub(LoopbackServer):
    thread_name = "fake-hub"

    def __init__(self, repos: dict[str, dict[str, bytes]], gated: dict[str, set[str]] | None = None,
                 tokens: set[str] | None = None):
        """`gated`: repo -> the tokens whose accounts accepted its licence; `tokens`: the tokens the hub
        knows (a gated repo answers as the hub does: 401 without a token or with an unknown one, 403
        with a known token that did not accept; its model info stays public)."""
        self.repos = repos
        self.gated = gated or {}
        self.tokens = set(tokens or ()) | {t for accepted in self.gated.values() for t in accepted}
        self.fetched: Counter[str] = Counter()  # "repo/path" -> bytes sent by GET
        self.lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                return None

            def do_HEAD(self):
                hub._serve(self, head=True)

            def do_GET(self):
                hub._serve(self, head=False)

        self.bind(Handler)
        self.endpoint = self.address()

    def bytes_fetched(self) -> int:
        with self.lock:
            return sum(self.fetched.values())

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str] | None = None,
              head: bool = False) -> None:
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def _entry(self, path: str, data: bytes) -> dict:
        entry = {"type": "file", "oid": hashlib.sha1(data).hexdigest(), "size": len(data), "path": path}
        if not path.endswith((".json", ".txt", ".md")):
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry

    def _refused(self, h: BaseHTTPRequestHandler, repo: str, head: bool) -> bool:
        """The hub's answers for a gated repository's files (recorded from huggingface.co)."""
        if repo not in self.gated:
            return False
        auth = h.headers.get("Authorization") or ""
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        if token in self.gated[repo]:
            return False
        if token is not None and token not in self.tokens:
            msg, status, code = "Invalid credentials in Authorization header", 401, None
        elif token is None:
            msg, status, code = (f"Access to model {repo} is restricted. You must have access to it and be "
                                 "authenticated to access it. Please log in."), 401, "GatedRepo"
        else:
            msg, status, code = (f"Access to model {repo} is restricted and you are not in the authorized list. "
                                 f"Visit https://huggingface.co/{repo} to ask for access."), 403, "GatedRepo"
        headers = {"Content-Type": "application/json", "X-Error-Message": msg, **({"X-Error-Code": code} if code else {})}
        self._send(h, status, json.dumps({"error": msg}).encode(), headers, head)
        return True

    def _serve(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        url = urlsplit(h.path)
        path = unquote(url.path)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/auth-check", path)
        if m and m[1] in self.repos:
            if not self._refused(h, m[1], head):
                self._send(h, 200, b"{}", {"Content-Type": "application/json"}, head)
            return
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m and m[1] in self.repos:
            files = self.repos[m[1]]
            body = json.dumps({"id": m[1], "modelId": m[1], "sha": SHA, "private": False, "disabled": False,
                               "gated": "manual" if m[1] in self.gated else False,
                               "siblings": [{"rfilename": f} for f in files]}).encode()
            return self._send(h, 200, body, {"Content-Type": "application/json"}, head)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path)
        if m and m[1] in self.repos:
            under = (m[3] or "").strip("/")
            files = self.repos[m[1]]
            entries = [self._entry(p, d) for p, d in sorted(files.items()) if not under or p.startswith(under + "/")]
            folders = sorted({p.rsplit("/", 1)[0] for p in files if "/" in p})
            entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in folders
                        if not under or d.startswith(under + "/")]
            return self._send(h, 200, json.dumps(entries).encode(), {"Content-Type": "application/json"}, head)
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m and m[1] in self.repos and m[3] in self.repos[m[1]]:
            if self._refused(h, m[1], head):
                return
            data = self.repos[m[1]][m[3]]
            etag = hashlib.sha256(data).hexdigest() if "lfs" in self._entry(m[3], data) else hashlib.sha1(data).hexdigest()
            headers = {"X-Repo-Commit": SHA, "ETag": f'"{etag}"', "Content-Type": "application/octet-stream",
                       "Accept-Ranges": "bytes"}
            if not head:
                with self.lock:
                    self.fetched[f"{m[1]}/{m[3]}"] += len(data)
            return self._send(h, 200, data, headers, head)
        self._send(h, 404, b'{"error": "Repository Not Found"}',
                   {"Content-Type": "application/json", "X-Error-Code": "RepoNotFound"}, head)
