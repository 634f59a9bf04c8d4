"""Batch image generation on the host: work items, leases and images all live in the job's bucket.

No broker and no head node: workers coordinate only through the store's conditional writes
(create-only and compare-and-swap). See docs/batch.md for the protocol and what exactly-once means.
"""
