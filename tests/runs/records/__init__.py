"""What is kept of a run: the state store, the journal in its bucket, secrets at the end."""
