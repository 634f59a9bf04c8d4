"""The agent's stores: S3 and its compatibles, presigned URLs, faults absorbed."""
