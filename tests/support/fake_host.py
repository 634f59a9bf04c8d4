"""Fakes for the agent tests: local metadata servers (AWS IMDSv2, Tencent), a throttling TCP
proxy in front of the S3 server, and a fake trainer that speaks the builtin trainer's protocol.

Run as a script, this file IS the fake trainer (see `fake_trainer`)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from tests.support.server_http import LoopbackServer

# ----------------------------------------------------------------------------------------------
# Metadata servers
# ----------------------------------------------------------------------------------------------


class _MetadataServer(LoopbackServer):
    thread_name = "fake-metadata"

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                server._handle(self, "GET")

            def do_PUT(self):
                server._handle(self, "PUT")

        self.bind(Handler)

    @property
    def base_url(self) -> str:
        return self.address()

    def _handle(self, h, method):
        with self.lock:
            self.requests.append((method, h.path))
            status, body = self.respond(method, h.path, h.headers)  # case-insensitive, like IMDS
        data = body.encode()
        h.send_response(status)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)


class AwsMetadataServer(_MetadataServer):
    """IMDSv2: tokens required; a spot instance-action and a rebalance recommendation on demand."""

    def __init__(self):
        super().__init__()
        self.tokens: set[str] = set()
        self.action: dict | None = None
        self.rebalance: dict | None = None
        # The instance role's temporary keys, as IMDS serves them (None: no role attached).
        self.role: tuple[str, dict] | None = None
        # This instance's index in its RunInstances request (a group launched at once numbers its hosts).
        self.launch_index = 0

    def attach_role(self, name: str, key: str, secret: str, token: str = "") -> None:
        expires = (datetime.now(timezone.utc) + timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%SZ")
        with self.lock:
            self.role = (name, {"Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": key, "SecretAccessKey": secret,
                                "Token": token, "Expiration": expires,
                                "LastUpdated": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")})

    def announce(self, seconds: float = 120.0, action: str = "terminate") -> None:
        when = datetime.now(timezone.utc) + timedelta(seconds=seconds)
        with self.lock:
            self.action = {"action": action, "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}

    def recommend_rebalance(self) -> None:
        with self.lock:
            self.rebalance = {"noticeTime": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}

    def reset(self) -> None:
        with self.lock:
            self.action = self.rebalance = None

    def expire_tokens(self) -> None:
        with self.lock:
            self.tokens.clear()

    def respond(self, method, path, headers):
        if path == "/latest/api/token":
            if method != "PUT" or headers.get("X-aws-ec2-metadata-token-ttl-seconds") is None:
                return 400, ""
            token = uuid.uuid4().hex
            self.tokens.add(token)
            return 200, token
        if headers.get("X-aws-ec2-metadata-token") not in self.tokens:
            return 401, ""
        if path == "/latest/meta-data/spot/instance-action":
            return (200, json.dumps(self.action)) if self.action else (404, "")
        if path == "/latest/meta-data/events/recommendations/rebalance":
            return (200, json.dumps(self.rebalance)) if self.rebalance else (404, "")
        if path == "/latest/meta-data/ami-launch-index":
            return 200, str(self.launch_index)
        creds = "/latest/meta-data/iam/security-credentials/"
        if path.startswith(creds) and self.role is not None:
            name, doc = self.role
            rest = path[len(creds):]
            if rest == "":
                return 200, name
            if rest == name:
                return 200, json.dumps(doc)
        return 404, ""


class TencentMetadataServer(_MetadataServer):
    def __init__(self):
        super().__init__()
        self.when: datetime | None = None

    def announce(self, seconds: float = 120.0) -> None:
        with self.lock:
            self.when = datetime.now(timezone(timedelta(hours=8))) + timedelta(seconds=seconds)

    def reset(self) -> None:
        with self.lock:
            self.when = None

    def respond(self, method, path, headers):
        if path == "/latest/meta-data/spot/termination-time" and self.when is not None:
            return 200, self.when.strftime("%Y-%m-%d %H:%M:%S")
        return 404, ""


# ----------------------------------------------------------------------------------------------
# A throttling proxy in front of the S3 server: slows uploads and tells when one is running
# ----------------------------------------------------------------------------------------------


class SlowProxy:
    def __init__(self, upstream_port: int, bytes_per_s: float = 0.0, marker: bytes = b"/checkpoints/",
                 down_bytes_per_s: float = 0.0):
        self.upstream = ("127.0.0.1", upstream_port)
        self.rate = bytes_per_s  # each connection's requests (uploads)
        self.down_rate = down_bytes_per_s  # each connection's responses (restores)
        self.marker = marker
        self.upload_seen = threading.Event()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def stop(self):
        self._stop = True
        self.sock.close()

    def _accept(self):
        while not self._stop:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            up = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, up, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, client, False), daemon=True).start()

    def _pump(self, src, dst, upstream: bool):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if upstream and b"PUT " in data and self.marker in data and b"manifest.json" not in data:
                    self.upload_seen.set()
                rate = self.rate if upstream else self.down_rate
                if rate:
                    time.sleep(len(data) / rate)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


# ----------------------------------------------------------------------------------------------
# The fake trainer (the builtin protocol, no torch): run this file as a script
# ----------------------------------------------------------------------------------------------


def _payload(step: int, size: int) -> bytes:
    seed = hashlib.sha256(f"weights-{step}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def fake_trainer() -> int:
    """Env: SDCLOUD_CHECKPOINT_DIR, SDCLOUD_RESUME_FROM, SDCLOUD_STEPS, SDCLOUD_CHECKPOINT_EVERY,
    SDCLOUD_OUTPUT_DIR; FAKE_STEP_SECONDS, FAKE_CKPT_BYTES, FAKE_FAIL_AT (crash at that step)."""
    ckpt_dir = Path(os.environ["SDCLOUD_CHECKPOINT_DIR"])
    steps = int(os.environ["SDCLOUD_STEPS"])
    every = int(os.environ["SDCLOUD_CHECKPOINT_EVERY"])
    out = Path(os.environ["SDCLOUD_OUTPUT_DIR"])
    step_s = float(os.environ.get("FAKE_STEP_SECONDS", "0.02"))
    size = int(os.environ.get("FAKE_CKPT_BYTES", "100000"))
    fail_at = int(os.environ.get("FAKE_FAIL_AT", "0"))
    step = 0
    resume = os.environ.get("SDCLOUD_RESUME_FROM")
    if resume:
        state = json.loads((Path(resume) / "state.json").read_text())
        data = (Path(resume) / "weights.bin").read_bytes()
        # A corrupted or partial resume must never pass silently.
        if hashlib.sha256(data).hexdigest() != state["sha256"] or data != _payload(state["step"], len(data)):
            print(f"CORRUPT RESUME from {resume}", flush=True)
            return 2
        step = state["step"]
        print(f"resumed at step {step}", flush=True)
    stop = {"term": False, "save": False}
    signal.signal(signal.SIGTERM, lambda *a: stop.__setitem__("term", True))
    signal.signal(signal.SIGUSR1, lambda *a: stop.__setitem__("save", True))

    def save(n: int) -> None:
        final = ckpt_dir / f"step-{n:09d}"
        if final.exists():
            return
        tmp = ckpt_dir / f".tmp-{n}-{os.getpid()}"
        tmp.mkdir(parents=True, exist_ok=True)
        data = _payload(n, size)
        (tmp / "weights.bin").write_bytes(data)
        (tmp / "sub").mkdir(exist_ok=True)
        (tmp / "sub" / "optimizer.bin").write_bytes(data[: size // 3])
        (tmp / "state.json").write_text(json.dumps({"step": n, "sha256": hashlib.sha256(data).hexdigest()}))
        os.replace(tmp, final)
        print("SDCLOUD_CHECKPOINT " + json.dumps({"step": n, "path": str(final)}), flush=True)

    t0 = time.time()
    while step < steps:
        time.sleep(step_s)
        step += 1
        if fail_at and step == fail_at:
            print("Traceback (most recent call last):\nRuntimeError: CUDA out of memory (fake)", flush=True)
            return 1
        print("SDCLOUD_STEP " + json.dumps({"step": step, "loss": 1.0 / step, "it_per_s": step / (time.time() - t0)}),
              flush=True)
        if step % every == 0 or stop["save"]:
            stop["save"] = False
            save(step)
        if stop["term"]:
            save(step)
            return 143
    save(step)
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.bin").write_bytes(_payload(step, 1000))
    print("SDCLOUD_DONE " + json.dumps({"step": step}), flush=True)
    return 0


def fake_external(kind: str, argv: list[str]) -> int:
    """Mimics an external trainer that cannot save on demand (SIGTERM just kills it):
    kind "diffusers": checkpoint-<global step>/ written file by file (RNG state last), old ones
    deleted *before* a save beyond --checkpoints_total_limit, `--resume_from_checkpoint latest`.
    kind "kohya-db": <name>-step<local:08d>-state/ with train_state.json; on --resume it loads the
    state but counts its steps from 0 again (like sd-scripts' DreamBooth scripts).
    Prints `FAKESTEP <global step>` (stdout) and tqdm bars (stderr).
    The diffusers kind validates as the scripts do: an epoch is ceil(images / --train_batch_size) steps
    (the images of --instance_data_dir or the --dataset_name imagefolder); after the last step of every
    --validation_epochs-th epoch, after that step's checkpoint, --num_validation_images images of
    --validation_prompt go to the tracker: with --report_to tensorboard (or all) as a `validation` image
    summary at the epoch's number in <output_dir>/<logging_dir>/dreambooth-lora-sd-xl/ (through
    tensorboardX, as accelerate's tracker); wandb (or all) without WANDB_API_KEY stops as wandb.init does."""
    import argparse
    ap = argparse.ArgumentParser()
    for flag in ("--output_dir", "--max_train_steps", "--checkpointing_steps", "--resume_from_checkpoint",
                 "--checkpoints_total_limit", "--save_every_n_steps", "--resume", "--output_name",
                 "--validation_prompt", "--validation_epochs", "--num_validation_images", "--seed", "--report_to",
                 "--logging_dir", "--instance_data_dir", "--dataset_name", "--train_batch_size"):
        ap.add_argument(flag)
    a, _ = ap.parse_known_args(argv)
    writer, per_epoch = None, 0
    if kind == "diffusers":
        if a.report_to in ("wandb", "all") and not os.environ.get("WANDB_API_KEY"):
            print("wandb.errors.UsageError: api_key not configured (no-tty)", file=sys.stderr, flush=True)
            return 1
        data = a.instance_data_dir or a.dataset_name
        n = sum(1 for f in Path(data).rglob("*") if f.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp")) if data else 0
        per_epoch = -(-n // int(a.train_batch_size or 1)) if n else 0
        if a.report_to in ("tensorboard", "all") and a.validation_prompt:
            from tensorboardX import SummaryWriter

            writer = SummaryWriter(str(Path(a.output_dir) / (a.logging_dir or "logs") / "dreambooth-lora-sd-xl"))
    out = Path(a.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    step_s = float(os.environ.get("FAKE_STEP_SECONDS", "0.05"))
    total = int(a.max_train_steps)
    every = int(a.checkpointing_steps or a.save_every_n_steps)
    done = 0  # what the saved state says was trained before this process
    local = 0
    if kind == "diffusers" and a.resume_from_checkpoint == "latest":
        ckpts = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        if ckpts:
            local = int(ckpts[-1].name.split("-")[1])
            done = _check_state(ckpts[-1])
            assert done == local, (done, local)
    if kind == "kohya-db" and a.resume:
        done = _check_state(Path(a.resume))
    t0 = time.time()
    while local < total:
        time.sleep(step_s)
        local += 1
        glob = local if kind == "diffusers" else done + local
        print(f"FAKESTEP {glob}", flush=True)
        sys.stderr.write(f"\rSteps: {100 * local // total}%|##| {local}/{total} "
                         f"[00:01<00:01, {local / (time.time() - t0):.2f}it/s, loss={1 / glob:.4f}]")
        sys.stderr.flush()
        if local % every == 0:
            if kind == "diffusers":
                limit = int(a.checkpoints_total_limit or 0)
                old = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
                import shutil
                for d in old[: max(0, len(old) - limit + 1)] if limit else []:
                    shutil.rmtree(d)
                d = out / f"checkpoint-{local}"
            else:
                d = out / f"{a.output_name}-step{local:08d}-state"
            # The diffusers LoRA scripts' save_model_hook: the LoRA of this step in the state, before the RNG.
            extra = {"pytorch_lora_weights.safetensors": _payload(glob, 300)} if kind == "diffusers" else {}
            _save_state(d, glob, slow=step_s, extra=extra)
        if writer is not None and per_epoch and local % per_epoch == 0:
            epoch = local // per_epoch - 1
            if epoch % int(a.validation_epochs or 50) == 0:
                import numpy as np

                count = int(a.num_validation_images or 4)
                shade = (glob * 7 + int(a.seed or 0) * 13) % 256
                writer.add_images("validation", np.full((count, 8, 8, 3), shade, dtype=np.uint8), epoch,
                                  dataformats="NHWC")
                writer.flush()
    if writer is not None:
        writer.close()
    (out / "final_weights.safetensors").write_bytes(_payload(total, 500))
    return 0


def _save_state(d: Path, glob: int, slow: float, extra: dict | None = None) -> None:
    d.mkdir(parents=True)
    for name, data in (extra or {}).items():
        (d / name).write_bytes(data)
    data = _payload(glob, 50_000)
    (d / "model.safetensors").write_bytes(data)
    time.sleep(slow)  # not atomic: a watcher can see a half-written folder
    (d / "train_state.json").write_text(json.dumps({"global": glob, "sha256": hashlib.sha256(data).hexdigest()}))
    (d / "random_states_0.pkl").write_bytes(b"rng")


def _check_state(d: Path) -> int:
    state = json.loads((d / "train_state.json").read_text())
    data = (d / "model.safetensors").read_bytes()
    if hashlib.sha256(data).hexdigest() != state["sha256"] or data != _payload(state["global"], len(data)):
        print(f"CORRUPT RESUME from {d}", flush=True)
        sys.exit(2)
    return int(state["global"])


if __name__ == "__main__":
    # The diffusers example scripts by name too (train_dreambooth_lora_sd3.py ...): the adapter's
    # per-script flags then reach the fake as they reach the real script.
    diffusers_script = len(sys.argv) > 1 and sys.argv[1].startswith("train_dreambooth")
    if len(sys.argv) > 1 and (sys.argv[1] in ("diffusers", "sdxl_train.py") or diffusers_script):
        kind = "diffusers" if sys.argv[1] == "diffusers" or diffusers_script else "kohya-db"
        sys.exit(fake_external(kind, sys.argv[2:]))
    sys.exit(fake_trainer())
