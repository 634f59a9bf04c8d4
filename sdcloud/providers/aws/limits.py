"""What AWS refuses, as data: the sizes and names its APIs accept for what sdcloud builds.

Each figure cites the page it comes from. tests/providers/test_limits.py holds every payload sdcloud builds
(the per-run user-data, the tags of a launch, the bucket's keys) to these figures at the largest
size a real run produces, so a payload that grows past one fails a test here, not a user's launch.
"""

from __future__ import annotations

# EC2 user data: "limited to 16 KB, in raw form, before it is base64-encoded" (Amazon EC2 User
# Guide, "Work with instance user data", docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-add-user-data.html).
USER_DATA_RAW_BYTES = 16 * 1024
USER_DATA_BASE64_BYTES: int | None = None  # counted before base64 only

# Tags, per resource: at most 50 user tags, a key of at most 128 and a value of at most 256 Unicode
# characters, keys unique, no `aws:` prefix (the tag restrictions every AWS service states, e.g.
# the ECS API's Tag type and the EC2 User Guide's "Tag your Amazon EC2 resources": Tag restrictions).
TAGS_PER_RESOURCE = 50
TAG_KEY_CHARS = 128
TAG_VALUE_CHARS = 256
TAG_RESERVED_PREFIXES = ("aws:",)

# S3: an object key is at most 1,024 bytes of UTF-8, prefixes and delimiters included (Amazon S3
# User Guide, "Naming Amazon S3 objects", docs.aws.amazon.com/AmazonS3/latest/userguide/object-keys.html);
# a general purpose bucket's name is 3 to 63 lowercase letters, digits, dots and hyphens, starting
# and ending with a letter or digit (S3 User Guide, "General purpose bucket naming rules").
OBJECT_KEY_BYTES = 1024
OBJECT_KEY_NO_LEADING: tuple[str, ...] = ()
BUCKET_NAME_CHARS = (3, 63)
BUCKET_NAME_PATTERN = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
BUCKET_DOMAIN_CHARS: int | None = None  # the name's own length is the rule

# The EC2 Query API documents no request size of its own beyond the fields' (user data above).
API_POST_BYTES: int | None = None

# Lambda: one invocation runs at most 900 s (15 minutes); a .zip uploaded directly in the request is
# at most 50 MB, the package unzipped (with its layers) at most 250 MB (AWS Lambda Developer Guide,
# "Lambda quotas", docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html).
FUNCTION_TIMEOUT_SECONDS = 900
FUNCTION_ZIP_DIRECT_BYTES = 50 * 1024 * 1024
FUNCTION_UNZIPPED_BYTES = 250 * 1024 * 1024

# Lambda's CreateFunction request with the zip inline: Lambda refuses a body over 69,905,067 bytes
# ("Request must be smaller than 69905067 bytes for the CreateFunction operation"), the 50 MB zip
# base64-encoded (ceil(52,428,800 x 4 / 3)). All environment variables together: at most 4 KB
# ("Lambda quotas", as above). The cloud driver's stack checks its package against these
# (sdcloud/infra/function_package.py, tests/stacks/test_stacks_driver.py).
FUNCTION_CREATE_REQUEST_BYTES = 69_905_067
FUNCTION_ENVIRONMENT_BYTES = 4 * 1024
# Lambda's Python runtimes and the day after which a new function can no longer be created with each
# ("Block function create": AWS Lambda Developer Guide, "Building Lambda functions with Python",
# docs.aws.amazon.com/lambda/latest/dg/lambda-python.html). python3.11's was 2027-07-31.
FUNCTION_PYTHON_BLOCK_CREATE = {"python3.13": "2029-07-31", "python3.12": "2028-11-30"}
