"""What Vast.ai and the run's store refuse, as data (tests/providers/test_limits.py holds sdcloud's payloads to them).

The store is an S3 bucket (Vast.ai has none of its own), so the key and bucket figures are S3's. The
instance carries no tags: its `label` holds the run and attempt, from which the three sdcloud tags are
read back (compute.tags_of); the tag figures below bound those derived tags and the label.
"""

from __future__ import annotations

# `onstart`: Vast.ai documents no size for the create request's onstart script. sdcloud holds it to
# EC2's user-data figure (16 KiB before base64, Amazon EC2 User Guide, "Work with instance user data"),
# the size its per-run user-data is already built to: an assumption, not a published limit.
USER_DATA_RAW_BYTES = 16 * 1024
USER_DATA_BASE64_BYTES: int | None = None  # sent as JSON text, not base64

# The label is the only tag-like field (vast.py `label instance`, `create instance --label`); no length
# is documented. sdcloud's label is `sdcloud-<run id>.a<attempt>`: the derived tags are sdcloud:run,
# sdcloud:attempt and sdcloud:token, and a label over LABEL_CHARS is not sent (an assumption, like the
# AWS tag value's 256).
TAGS_PER_RESOURCE = 3
TAG_KEY_CHARS = 16  # "sdcloud:attempt" is the longest derived key
LABEL_CHARS = 256
TAG_VALUE_CHARS = LABEL_CHARS
TAG_RESERVED_PREFIXES = ("vast:",)  # none documented; a derived key never has it

# The run's bucket: S3's rules (Amazon S3 User Guide, "Naming Amazon S3 objects"; "General purpose
# bucket naming rules").
OBJECT_KEY_BYTES = 1024
OBJECT_KEY_NO_LEADING: tuple[str, ...] = ()
BUCKET_NAME_CHARS = (3, 63)
BUCKET_NAME_PATTERN = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
BUCKET_DOMAIN_CHARS: int | None = None

# The REST API documents no request size of its own.
API_POST_BYTES: int | None = None
