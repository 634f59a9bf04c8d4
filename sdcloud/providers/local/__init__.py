"""This machine as a provider: agent processes (provider.py) and a metadata endpoint that can announce a reclaim (metadata.py)."""
