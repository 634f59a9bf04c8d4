"""The URL schemes a store is named by: the one registry the host agent and the control plane both read.

A bucket is reached through the S3 API whatever its cloud calls it: `s3://` on Amazon S3 and any
S3-compatible server, `cos://` on Tencent COS (its S3 endpoint; cos.py says what differs). A folder
is `file://` (or a plain path). The control plane's providers declare which of these their hosts
may use (`ProviderTraits.stores`), and its checks of a user's `--store` read this same list, so a
new bucket dialect is one entry here and one in its provider's traits.
"""

from __future__ import annotations

S3 = "s3"  # Amazon S3, and any S3-compatible server (an endpoint_url names it)
COS = "cos"  # Tencent COS through its S3 endpoint
FILE = "file"  # a folder of the machine the store is opened on

# Every bucket dialect, in the order a message lists them.
BUCKETS = (S3, COS)
# The schemes every machine opens the same way: no provider's own credentials or client.
GENERIC = (S3, FILE)


def is_bucket(scheme: str) -> bool:
    """Whether a URL scheme names a bucket (reached through the S3 API)."""
    return scheme in BUCKETS


def is_remote(scheme: str) -> bool:
    """Whether a URL scheme names a store rather than a plain path (a bucket or a file:// folder)."""
    return is_bucket(scheme) or scheme == FILE


def forms(dialects: tuple[str, ...] = BUCKETS, folder: bool = True) -> str:
    """How to write a store URL, for messages: "s3://BUCKET/PREFIX, cos://BUCKET/PREFIX or file:///DIR"."""
    parts = [f"{d}://BUCKET/PREFIX" for d in BUCKETS if d in dialects] + ([f"{FILE}:///DIR"] if folder else [])
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]
