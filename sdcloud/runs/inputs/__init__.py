"""A run's inputs, settled before anything launches: the spec (flags over a run file), the trainer,
model, dataset and network settings, config.toml's checks, the preflight refusals, and staging what
the user's machine holds into the run's bucket (staging.py)."""
