"""COS requests judged against a CAM policy, action by action, as COS does for a role's keys.

The API-to-action table follows Tencent's COS action list (https://cloud.tencent.com/document/product/436/31923)
and the API pages it links:
- PUT Object - Copy is `name/cos:PutObjectCopy` on the destination, and the requester must be able
  to read the source (https://www.tencentcloud.com/document/product/436/10881): `name/cos:GetObject` on it;
- Upload Part - Copy is `name/cos:UploadPartCopy`, with `name/cos:GetObject` on the source (product/436/8287);
- DELETE Multiple Objects needs `name/cos:DeleteMultipleObjects`, and each object is checked for
  `name/cos:DeleteObject` (product/436/8289). Where a key is refused this layer refuses the whole
  request (COS lists it in the answer's Errors instead); the store raises on either.
Resources are six-segment names, `qcs::cos:<region>:uid/<appid>:<bucket>-<appid>/<key>` for an
object; a bucket action's resource here is `<bucket>/` (what `<bucket>/*` in a policy covers).
Conditions: `string_like` / `string_equal` on `cos:prefix` (GET Bucket's prefix parameter).
Anything the table does not name is refused: a role gets nothing it was not given.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass(frozen=True)
class Need:
    action: str      # name/cos:...
    resource: str    # six-segment resource name
    context: tuple[tuple[str, str], ...] = ()  # condition keys the request sets


def _glob(pattern: str, value: str) -> bool:
    # CAM's wildcard is `*` alone; keep `?` and `[` literal.
    return fnmatchcase(value, pattern.replace("[", "[[]").replace("?", "[?]"))


def _source(header: str, region: str, app_id: str) -> tuple[str, str]:
    """(bucket, key) of a copy source: `<bucket>.cos.<region>.myqcloud.com/<key>` or S3's `<bucket>/<key>`."""
    value = unquote(header.split("?versionId=")[0]).lstrip("/")
    head, _, key = value.partition("/")
    return head.split(".cos.")[0], key


def needs(method: str, host_bucket: str | None, region: str, app_id: str, path: str,
          headers: dict[str, str], body: bytes = b"") -> list[Need]:
    """The (action, resource) pairs one COS request must be allowed."""
    url = urlsplit(path)
    query = parse_qs(url.query, keep_blank_values=True)
    if host_bucket is None:
        return [Need("name/cos:GetService", "*")]
    base = f"qcs::cos:{region}:uid/{app_id}:{host_bucket}"
    key = unquote(url.path.lstrip("/"))
    obj = f"{base}/{key}"
    copy = headers.get("x-cos-copy-source") or headers.get("x-amz-copy-source")

    def source() -> Need:
        sb, sk = _source(copy or "", region, app_id)
        return Need("name/cos:GetObject", f"qcs::cos:{region}:uid/{app_id}:{sb}/{sk}")

    if not key:  # bucket APIs
        bucket_res = f"{base}/"
        if method == "GET" and "uploads" in query:
            return [Need("name/cos:ListMultipartUploads", bucket_res)]
        if method == "GET" and not (set(query) - {"list-type", "prefix", "delimiter", "marker", "max-keys",
                                                   "continuation-token", "start-after", "encoding-type",
                                                   "fetch-owner"}):
            return [Need("name/cos:GetBucket", bucket_res, (("cos:prefix", query.get("prefix", [""])[0]),))]
        if method == "HEAD":
            return [Need("name/cos:HeadBucket", bucket_res)]
        if method == "PUT" and not query:
            return [Need("name/cos:PutBucket", bucket_res)]
        if method == "POST" and "delete" in query:
            keys = [html.unescape(k.decode()) for k in re.findall(rb"<Key>(.*?)</Key>", body or b"", re.S)]
            return [Need("name/cos:DeleteMultipleObjects", bucket_res)] + [
                Need("name/cos:DeleteObject", f"{base}/{k}") for k in keys]
        return [Need(f"name/cos:Unknown{method}Bucket", bucket_res)]
    if "tagging" in query:
        return [Need({"GET": "name/cos:GetObjectTagging", "PUT": "name/cos:PutObjectTagging",
                      "DELETE": "name/cos:DeleteObjectTagging"}.get(method, "name/cos:Unknown"), obj)]
    if "acl" in query:
        return [Need({"GET": "name/cos:GetObjectACL", "PUT": "name/cos:PutObjectACL"}.get(method, "name/cos:Unknown"), obj)]
    if method == "PUT" and "partNumber" in query and "uploadId" in query:
        return [Need("name/cos:UploadPartCopy", obj), source()] if copy else [Need("name/cos:UploadPart", obj)]
    if method == "PUT":
        return [Need("name/cos:PutObjectCopy", obj), source()] if copy else [Need("name/cos:PutObject", obj)]
    if method == "POST" and "uploads" in query:
        return [Need("name/cos:InitiateMultipartUpload", obj)]
    if method == "POST" and "uploadId" in query:
        return [Need("name/cos:CompleteMultipartUpload", obj)]
    if method == "GET" and "uploadId" in query:
        return [Need("name/cos:ListParts", obj)]
    if method == "GET":
        return [Need("name/cos:GetObject", obj)]
    if method == "HEAD":
        return [Need("name/cos:HeadObject", obj)]
    if method == "DELETE" and "uploadId" in query:
        return [Need("name/cos:AbortMultipartUpload", obj)]
    if method == "DELETE":
        return [Need("name/cos:DeleteObject", obj)]
    return [Need(f"name/cos:Unknown{method}Object", obj)]


def _condition_holds(condition: dict, context: dict[str, str]) -> bool:
    for op, pairs in condition.items():
        for ckey, wanted in pairs.items():
            wanted = wanted if isinstance(wanted, list) else [wanted]
            if ckey not in context:
                return False
            have = context[ckey]
            if op == "for_any_value:string_equal":  # a key with many values (qcs:resource_tag): any one
                haves = have if isinstance(have, (list, tuple)) else [have]
                if not any(h in wanted for h in haves):
                    return False
                continue
            if op == "string_like" and not any(_glob(w, have) for w in wanted):
                return False
            if op == "string_equal" and have not in wanted:
                return False
            if op not in ("string_like", "string_equal"):
                return False  # an operator this judge does not know grants nothing
    return True


def allowed(policy: dict | str, need: Need) -> bool:
    """True when a statement allows the need and none denies it (CAM: an explicit deny wins)."""
    doc = json.loads(policy) if isinstance(policy, str) else policy
    context = dict(need.context)
    allow = False
    for st in doc.get("statement", []):
        actions = st.get("action", [])
        actions = [actions] if isinstance(actions, str) else actions
        resources = st.get("resource", [])
        resources = [resources] if isinstance(resources, str) else resources
        if not any(_glob(a, need.action) for a in actions):
            continue
        if not any(_glob(r, need.resource) for r in resources):
            continue
        if "condition" in st and not _condition_holds(st["condition"], context):
            continue
        if st.get("effect") == "deny":
            return False
        allow = allow or st.get("effect") == "allow"
    return allow


def denied(policy: dict | str, wanted: list[Need]) -> Need | None:
    """The first need the policy does not allow, or None."""
    return next((n for n in wanted if not allowed(policy, n)), None)
