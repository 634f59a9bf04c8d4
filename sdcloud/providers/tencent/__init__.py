"""Tencent Cloud: CVM compute and catalog refresh (compute.py), COS through its S3 endpoint (storage.py)."""
