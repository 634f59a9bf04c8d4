"""Every presigned URL a store signs is SigV4, in every region, and S3's own check takes it as a
sender sends it (urllib adds Content-Type to a PUT with a body). The store is configured as
production configures it (a bucket and a region, no endpoint); its URL is delivered to
tests/support/fronts/front_s3_signatures.py with the URL's own Host, as if DNS named the front, and the
front checks it with botocore's signers, as S3 does, then hands it to SeaweedFS."""

from __future__ import annotations

import functools
import http.client
import ssl
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest

from sdcloud_agent.store.s3 import S3Store

from tests.support.fronts.front_s3_signatures import SignatureCheckingFront, check_v2, check_v4
from tests.support.server_seaweed import TEST_KEYS

REGIONS = ("us-east-1", "eu-west-1", "ap-southeast-2")
KEY = "runs/r-0000sig/checkpoints/000000001/model.safetensors"


@pytest.fixture
def keys(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "sdcloud-test", "AWS_SECRET_ACCESS_KEY": "sdcloud-test-secret"}.items():
        monkeypatch.setenv(k, v)
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def front(seaweed):
    with SignatureCheckingFront(seaweed, TEST_KEYS) as f:
        yield f


def _via(front, url: str, data: bytes | None = None, method: str = "GET", headers: dict | None = None) -> bytes:
    """`url` sent by urllib as a sender sends it, its TCP connection made to the front (DNS for the test)."""
    tls = ssl.create_default_context(cafile=str(front.ca_file))
    tls.check_hostname = False  # the front's certificate names 127.0.0.1, the URL an AWS host

    class ToFront(urllib.request.HTTPSHandler):
        def https_open(self, req):
            conn = functools.partial(_FrontConnection, front.port)
            return self.do_open(conn, req, context=tls)

    opener = urllib.request.build_opener(ToFront)
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    with opener.open(req, timeout=30) as resp:
        return resp.read()


class _FrontConnection(http.client.HTTPSConnection):
    def __init__(self, port, host, **kw):
        super().__init__("127.0.0.1", port, **kw)


def _bucket(seaweed, name: str) -> None:
    import boto3
    from botocore.config import Config

    s3 = boto3.client("s3", endpoint_url=seaweed.endpoint, region_name="us-east-1", verify=str(seaweed.ca_file),
                      config=Config(signature_version="s3v4"))
    try:
        s3.create_bucket(Bucket=name)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass


@pytest.mark.parametrize("region", REGIONS)
def test_the_aws_store_presigns_sigv4_get_and_put_in_every_region(keys, region):
    store = S3Store("sdcloud-sig-bucket", "sdcloud", region=region)
    for method in ("get", "put"):
        url = store.presign(KEY, method, 60)
        assert "X-Amz-Algorithm=AWS4-HMAC-SHA256" in url and "AWSAccessKeyId=" not in url
        assert f"%2F{region}%2Fs3%2Faws4_request" in url  # scoped to the bucket's region
        # The region's own host (us-east-1's is s3.amazonaws.com): no redirect for a young bucket.
        assert urlsplit(url).hostname == ("sdcloud-sig-bucket.s3.amazonaws.com" if region == "us-east-1"
                                          else f"sdcloud-sig-bucket.s3.{region}.amazonaws.com")
    url, headers = store.presign_put(KEY, 60)
    assert "X-Amz-Algorithm=AWS4-HMAC-SHA256" in url and headers == {"x-amz-tagging": "sdcloud-class=checkpoint"}


@pytest.mark.parametrize("region", ["us-east-1", "eu-west-1"])
def test_the_production_stores_presigned_put_and_get_are_taken_as_urllib_sends_them(keys, seaweed, front, region):
    _bucket(seaweed, "sdcloud-sig-bucket")
    store = S3Store("sdcloud-sig-bucket", "sdcloud", region=region)
    body = b"weights" * 1000
    url, signed = store.presign_put(KEY, 60)
    _via(front, url, data=body, method="PUT", headers={"Content-Length": str(len(body)), **signed})
    assert _via(front, store.presign(KEY, "get", 60)) == body
    assert [(v, m, verdict) for v, m, _, verdict in front.checked] == [("v4", "PUT", "taken"), ("v4", "GET", "taken")]


def test_a_sigv2_put_is_refused_as_s3_refuses_it_once_urllib_adds_content_type(keys, seaweed, front):
    """What the AWS store presigned before: SigV2 signs Content-Type, and urllib adds one to a PUT."""
    import boto3
    from botocore.config import Config

    _bucket(seaweed, "sdcloud-sig-bucket")
    old = boto3.client("s3", region_name="us-east-1", config=Config(signature_version="s3"))
    url = old.generate_presigned_url("put_object", Params={"Bucket": "sdcloud-sig-bucket", "Key": "sdcloud/v2"},
                                     ExpiresIn=60)
    assert "AWSAccessKeyId=" in url and "Signature=" in url
    with pytest.raises(urllib.error.HTTPError) as refused:
        _via(front, url, data=b"x" * 10, method="PUT")
    assert refused.value.code == 403
    assert b"<Code>SignatureDoesNotMatch</Code>" in refused.value.read()
    # The same SigV2 URL with no body (no Content-Type added): S3 takes it, and so does the front.
    get = old.generate_presigned_url("get_object", Params={"Bucket": "sdcloud-sig-bucket", "Key": "sdcloud/v2"},
                                     ExpiresIn=60)
    with pytest.raises(urllib.error.HTTPError) as missing:
        _via(front, get)
    assert missing.value.code == 404  # past the signature check: the key is not there
    assert [(v, verdict) for v, _, _, verdict in front.checked] == [("v2", "refused"), ("v2", "taken")]


def test_a_tampered_an_expired_and_an_unsigned_header_sigv4_url_are_refused(keys, seaweed, front):
    _bucket(seaweed, "sdcloud-sig-bucket")
    store = S3Store("sdcloud-sig-bucket", "sdcloud", region="eu-west-1")
    url = store.presign(KEY, "get", 60)
    for bad, code in ((url.replace("model.safetensors", "model2.safetensors"), b"SignatureDoesNotMatch"),
                      (url.replace("X-Amz-Expires=60", "X-Amz-Expires=61"), b"SignatureDoesNotMatch"),
                      (store.presign(KEY, "get", 1), b"AccessDenied")):
        if code == b"AccessDenied":
            time.sleep(2.1)
        with pytest.raises(urllib.error.HTTPError) as refused:
            _via(front, bad)
        assert refused.value.code == 403 and b"<Code>" + code + b"</Code>" in refused.value.read()
    put, signed = store.presign_put(KEY, 60)
    with pytest.raises(urllib.error.HTTPError) as unsigned:  # the tag it signed is not sent
        _via(front, put, data=b"x", method="PUT", headers={"Content-Length": "1"})
    assert unsigned.value.code == 403
    assert all(verdict == "refused" for *_, verdict in front.checked)


def test_the_verifier_checks_what_botocore_signs_and_nothing_else(keys):
    """The checks themselves, without a server: a URL as signed passes; one header or a week too long fails."""
    store = S3Store("sdcloud-sig-bucket", "sdcloud", region="ap-southeast-2")
    url, signed = store.presign_put(KEY, 300)
    split = urlsplit(url)
    target, host = f"{split.path}?{split.query}", split.netloc
    now = time.time()
    assert check_v4("PUT", host, target, {"content-type": "application/x-www-form-urlencoded", **signed},
                    TEST_KEYS, now) is None
    assert check_v4("PUT", host, target, {}, TEST_KEYS, now)[1] == "SignatureDoesNotMatch"
    assert check_v4("PUT", host, target, {"x-amz-tagging": "sdcloud-class=log"}, TEST_KEYS, now)[1] == "SignatureDoesNotMatch"
    assert check_v4("PUT", host, target, signed, TEST_KEYS, now + 301)[1] == "AccessDenied"
    assert check_v4("GET", host, target, signed, TEST_KEYS, now)[1] == "SignatureDoesNotMatch"
    long = store.client.generate_presigned_url("get_object", Params={"Bucket": "sdcloud-sig-bucket", "Key": "k"},
                                               ExpiresIn=8 * 24 * 3600)
    s = urlsplit(long)
    assert check_v4("GET", s.netloc, f"{s.path}?{s.query}", {}, TEST_KEYS, now)[0] == 400
    assert check_v2("GET", host, "/b/k?AWSAccessKeyId=nobody&Expires=1&Signature=x", {}, TEST_KEYS, now)[1] == \
        "InvalidAccessKeyId"
