"""GPU boxes the user owns, reached over SSH (provider.py)."""
