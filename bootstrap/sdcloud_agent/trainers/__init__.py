"""Trainers the host agent can run as a child process.

Each trainer is a module runnable with ``python -m sdcloud_agent.trainers.<name>``; the agent talks
to it only through flags, environment variables, signals, the checkpoint folder and stdout lines.
``builtin`` is sdcloud's own LoRA / DreamBooth trainer (see docs/trainer-builtin.md).
"""
