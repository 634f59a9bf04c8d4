"""What Tencent Cloud refuses, as data: the sizes and names its APIs accept for what sdcloud builds.

Each figure cites the page it comes from. tests/providers/test_limits.py holds every payload sdcloud builds
(the per-run user-data, the tags of a launch, the bucket's keys) to these figures at the largest
size a real run produces, so a payload that grows past one fails a test here, not a user's launch.
"""

from __future__ import annotations

# CVM RunInstances `UserData`: "base64-encoded, at most 16KB" (CVM API, RunInstances input
# parameters, cloud.tencent.com/document/api/213/15730; the same words in tencentcloud-sdk-python-cvm's
# RunInstancesRequest.UserData). The field is the encoded string, so sdcloud counts the 16 KB after
# base64: stricter than EC2's, and the one the agent's renderer checks (sdcloud_agent/userdata.py).
USER_DATA_RAW_BYTES: int | None = None  # counted after base64 only
USER_DATA_BASE64_BYTES = 16 * 1024

# A TencentCloud API 3.0 request: a GET at most 32 KB; a POST signed with TC3-HMAC-SHA256 at most
# 10 MB (1 MB with the older HmacSHA1/HmacSHA256 signatures) (API 3.0 "Request Structure", e.g.
# cloud.tencent.com/document/product/1278/46710 and every product's API "Request Structure" page).
API_GET_BYTES = 32 * 1024
API_POST_TC3_BYTES = 10 * 1024 * 1024
API_POST_BYTES = API_POST_TC3_BYTES  # sdcloud signs with TC3-HMAC-SHA256

# Tags, per resource: at most 50; a key 1 to 127 and a value 1 to 255 Unicode characters; keys
# beginning `qcs:` or `project` are reserved (Tag, "Use Limits", tencentcloud.com/document/product/651/13354).
TAGS_PER_RESOURCE = 50
TAG_KEY_CHARS = 127
TAG_VALUE_CHARS = 255
TAG_RESERVED_PREFIXES = ("qcs:", "project")

# COS: an object key is any UTF-8 of at most 850 bytes, not starting with `/` or `\` (COS "Object
# Overview", Naming conventions, tencentcloud.com/document/product/436/13324). A bucket is
# `<BucketName>-<APPID>`: BucketName of lowercase letters, digits and hyphens, not starting or ending
# with a hyphen, the whole virtual-hosted domain `<bucket>.cos.<region>.myqcloud.com` at most 60
# characters (COS "Bucket Overview", Bucket Naming Conventions, tencentcloud.com/document/product/436/13312).
OBJECT_KEY_BYTES = 850
OBJECT_KEY_NO_LEADING = ("/", "\\")
BUCKET_NAME_PATTERN = r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?-[0-9]+"
BUCKET_NAME_CHARS: tuple[int, int] | None = None  # bounded by the domain's length below
BUCKET_DOMAIN_CHARS = 60

# SCF, the cloud driver's function (stacks/tencent, sdcloud/infra/function_package.py):
# - a function version's code before compression, layers included, at most 500 MB; its environment
#   variables at most 4 KB; an invocation at most 900 s (SCF "Quota Limits",
#   cloud.tencent.com/document/product/583/11637, updated 2025-03-24);
# - a zip inline in the request (`Code.ZipFile`, base64) at most 20 MB (UpdateFunctionCode,
#   tencentcloud.com/document/product/583/18581; CreateFunction's SDK text says 50 MB): either way
#   the 10 MB of an API POST above binds first, so the stack puts the zip in COS and names it
#   (`Code.CosBucketName` without the -APPID, `Code.CosObjectName` starting with `/`: the Code type
#   in tencentcloud-sdk-python-scf's models);
# - the Python runtimes SCF offers (CreateFunction `Runtime`, and "Runtime Environment",
#   tencentcloud.com/document/product/583/40323, updated 2025-01-03): none is 3.11 or newer.
FUNCTION_UNZIPPED_BYTES = 500 * 1024 * 1024
FUNCTION_ENVIRONMENT_BYTES = 4 * 1024
FUNCTION_TIMEOUT_SECONDS = 900
FUNCTION_ZIP_INLINE_BYTES = 20 * 1024 * 1024
FUNCTION_PYTHON_RUNTIMES = ("Python3.10", "Python3.9", "Python3.7", "Python3.6", "Python2.7")
