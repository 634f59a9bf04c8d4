"""Batch image generation jobs: prompts, submission, progress, schedules (the host side is sdcloud_agent.batch)."""
