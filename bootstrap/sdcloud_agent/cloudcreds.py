"""Store credentials that boto3 cannot find by itself: a file the controller renews, or a cloud's role.

A box of the user's, reached over SSH, gets short-lived, prefix-scoped keys from the controller,
written to a 0600 file beside the agent's config and rewritten before they expire (`file_session`).
A cloud whose instance role boto3 does not know (Tencent's CVM role: clouds/tencent.py) hands its
key fetch to `refreshing_session`. Either way the keys are fed to botocore as refreshable
credentials, so an upload that runs past the expiry picks up new keys. Nothing here is written to
disk or logged.
"""

from __future__ import annotations

import json
from typing import Callable


def refreshing_session(fetch: Callable[[], dict], method: str):
    """A boto3 session on the keys `fetch()` gives (botocore's metadata shape), fetched again
    before they expire."""
    import boto3
    from botocore.credentials import RefreshableCredentials
    from botocore.session import get_session

    creds = RefreshableCredentials.create_from_metadata(metadata=fetch(), refresh_using=fetch, method=method)
    core = get_session()
    core._credentials = creds  # botocore has no public setter for a ready credential provider
    return boto3.Session(botocore_session=core)


def file_keys(path: str) -> dict:
    """The keys in the controller's credentials file (AWS STS shape), in botocore's metadata shape."""
    with open(path) as f:
        doc = json.load(f)
    return {"access_key": doc["AccessKeyId"], "secret_key": doc["SecretAccessKey"], "token": doc.get("SessionToken"),
            "expiry_time": doc["Expiration"]}


def file_session(path: str):
    """A boto3 session on the keys in `path`; botocore re-reads the file as they near their expiry."""
    return refreshing_session(lambda: file_keys(path), "sdcloud-credentials-file")
