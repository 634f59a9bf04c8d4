"""A standard-library S3 client for the first minutes of a host, before boto3 exists on it.

The user-data carries this file (no package install can fetch the agent wheel before the agent is
there). It signs with AWS Signature V4 using the instance role's temporary keys, fetched as the host's
cloud says (clouds/<kind>.py: IMDSv2 on AWS, the CAM role on Tencent; COS accepts V4 on its S3
endpoint). No long-lived secret, no presigned URL. Python 3.8+ and nothing else, because it runs
on the image's python3; the user-data's copy carries only its run's cloud's key fetch.

    python3 s3lite.py CONFIG get KEY DEST | put KEY SRC | head KEY
    python3 s3lite.py CONFIG report PHASES_FILE LOG_FILE [failed PHASE]

CONFIG is the agent's config (JSON): `store` (url, endpoint_url, region, credentials) and
`metadata` (kind, base_url). KEY is relative to the store's prefix.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import re
import shutil
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

EMPTY_SHA = hashlib.sha256(b"").hexdigest()
TAIL_LINES = 30


class S3Error(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(f"HTTP {status}: {text[:300]}")
        self.status = status


def _open(req, timeout=10):
    ca = os.environ.get("AWS_CA_BUNDLE")  # the same override boto3 honours
    ctx = ssl.create_default_context(cafile=ca) if ca else None
    return urllib.request.urlopen(req, timeout=timeout, context=ctx)


# @@CLOUD_ROLE_KEYS@@: userdata.py puts the run's cloud's boot_role_keys here (clouds/<kind>.py).


def role_credentials(metadata: dict, store: dict) -> dict:
    """{"key", "secret", "token"} from the instance role of the host's cloud (clouds.boot_cloud)."""
    try:
        from .clouds import boot_cloud
    except ImportError:  # the user-data's copy, alone on the host: its cloud's function is above
        return boot_role_keys(metadata or {}, _open)  # noqa: F821 - put in by userdata.py
    return boot_cloud(metadata, store).boot_role_keys(metadata or {}, _open)


def store_endpoint(store: dict) -> str:
    return store.get("endpoint_url") or ""


class Bucket:
    def __init__(self, store: dict, metadata: dict):
        url = urllib.parse.urlparse(store["url"])
        self.bucket, self.prefix = url.netloc, url.path.strip("/")
        self.region = store.get("region") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        endpoint = store.get("endpoint_url") or f"https://s3.{self.region}.amazonaws.com"
        ep = urllib.parse.urlparse(endpoint)
        if store.get("addressing_style") == "virtual" or not store.get("endpoint_url"):
            self.host, self.base_path = f"{self.bucket}.{ep.netloc}", ""
        else:
            self.host, self.base_path = ep.netloc, "/" + self.bucket
        self.scheme = ep.scheme or "https"
        self.store, self.metadata = store, metadata
        self._creds = None

    def _key(self, key: str) -> str:
        return "/".join(p for p in (self.prefix, key.strip("/")) if p)

    def request(self, method: str, key: str, body=None, length: int = 0, payload_hash: str = EMPTY_SHA,
                headers: dict | None = None, timeout: float = 60):
        if self._creds is None:
            self._creds = role_credentials(self.metadata, self.store)
        c = self._creds
        path = self.base_path + "/" + urllib.parse.quote(self._key(key), safe="/~")
        now = datetime.datetime.utcnow()
        amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        h = {"host": self.host, "x-amz-date": amz_date, "x-amz-content-sha256": payload_hash}
        if c.get("token"):  # only when there is one: an empty header is refused by some servers
            h["x-amz-security-token"] = c["token"]
        h.update({k.lower(): v for k, v in (headers or {}).items()})
        names = sorted(h)
        canonical = "\n".join([method, path, "", "".join(f"{n}:{str(h[n]).strip()}\n" for n in names),
                               ";".join(names), payload_hash])
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
        k = ("AWS4" + c["secret"]).encode()
        for part in (day, self.region, "s3", "aws4_request"):
            k = hmac.new(k, part.encode(), hashlib.sha256).digest()
        sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
        h["authorization"] = (f"AWS4-HMAC-SHA256 Credential={c['key']}/{scope}, "
                              f"SignedHeaders={';'.join(names)}, Signature={sig}")
        if body is not None:
            h["content-length"] = str(length)
        req = urllib.request.Request(f"{self.scheme}://{self.host}{path}", data=body, method=method,
                                     headers={k: v for k, v in h.items() if k != "host"})
        try:
            return _open(req, timeout)
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace")
            region = re.search(r"<Region>([a-z0-9-]+)</Region>", text)
            if exc.code in (301, 400) and region and region.group(1) != self.region and not hasattr(body, "read"):
                # Signed for the wrong region: S3 names the bucket's own; sign again for it.
                self.region = region.group(1)
                if not store_endpoint(self.store):
                    self.host = f"{self.bucket}.s3.{self.region}.amazonaws.com"
                return self.request(method, key, body, length, payload_hash, headers, timeout)
            raise S3Error(exc.code, text) from None

    def head(self, key: str) -> int | None:
        """The object's size, or None when it is not there."""
        try:
            with self.request("HEAD", key) as r:
                return int(r.headers.get("Content-Length") or 0)
        except S3Error as exc:
            if exc.status in (403, 404):  # S3 answers 403 for a missing key without ListBucket
                return None
            raise

    def get(self, key: str, dest: str) -> None:
        tmp = f"{dest}.part"
        with self.request("GET", key, timeout=300) as r, open(tmp, "wb") as f:
            shutil.copyfileobj(r, f, 1 << 20)
        os.replace(tmp, dest)

    def put_bytes(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> None:
        with self.request("PUT", key, body=data, length=len(data), payload_hash=hashlib.sha256(data).hexdigest(),
                          headers={"content-type": content_type}):
            pass

    def put_file(self, key: str, src: str) -> None:
        digest = hashlib.sha256()
        with open(src, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        with open(src, "rb") as f:
            with self.request("PUT", key, body=f, length=os.path.getsize(src), payload_hash=digest.hexdigest(),
                              timeout=600):
                pass


def read_phases(path: str) -> list:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def tail(path: str, n: int = TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 64 * 1024))
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-n:])
    except OSError:
        return ""


def report(put, cfg: dict, phases_file: str, log_file: str, failed: str | None = None, reason: str = "") -> None:
    """boot/attempt-<n>.json (every phase with its seconds) and logs/boot-<n>.log; on a failure
    also status.json `failed` with the phase and the log's last lines, which ends the attempt.
    `put(key, data)` writes one object (this module's Bucket, or the agent's store)."""
    run, n = cfg["run_id"], int(cfg.get("attempt", 1))
    doc = {"run": run, "attempt": n, "phases": read_phases(phases_file), "time": time.time(),
           "failed": failed}
    put(f"runs/{run}/boot/attempt-{n}.json", json.dumps(doc).encode())
    try:
        with open(log_file, "rb") as f:
            put(f"runs/{run}/logs/boot-{n}.log", f.read()[-4 * 1024 * 1024:])
    except OSError:
        pass
    if failed and not reason:
        status = {"run": run, "attempt": n, "phase": "failed", "boot_phase": failed, "step": 0,
                  "total_steps": cfg.get("steps"), "time": time.time(),
                  "reason": f"boot phase {failed} failed; last lines of the bootstrap log:\n{tail(log_file)}"}
        put(f"runs/{run}/status.json", json.dumps(status).encode())


def main(argv: list) -> int:
    with open(argv[0]) as f:
        cfg = json.load(f)
    b = Bucket(cfg["store"] if isinstance(cfg["store"], dict) else {"url": cfg["store"]}, cfg.get("metadata") or {})
    cmd, args = argv[1], argv[2:]
    try:
        if cmd == "get":
            b.get(args[0], args[1])
        elif cmd == "put":
            b.put_file(args[0], args[1])
        elif cmd == "head":
            size = b.head(args[0])
            print("" if size is None else size)
            return 0 if size is not None else 4
        elif cmd == "report":
            report(b.put_bytes, cfg, args[0], args[1], args[3] if len(args) > 3 and args[2] == "failed" else None)
        else:
            print(f"unknown command {cmd}", file=sys.stderr)
            return 2
    except (S3Error, OSError, KeyError, ValueError) as exc:
        print(f"s3lite {cmd}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
